"""The listening socket, uvicorn, and the signals that end the server.

The socket is bound before the weights load (a port in use fails at once, as an OSError) and listens only
once uvicorn starts. SIGTERM or Ctrl-C: new connections are no longer accepted, the worker refuses new jobs
and ends the queued and the running ones (503, the running one at its next token), uvicorn waits for the
open responses to end (at most ``GRACE_SECONDS``), then ``serve`` returns the signal for the caller to
report (the command exits 143 / 130 as every other command does)."""

from __future__ import annotations

import ipaddress
import socket

import uvicorn

from .worker import GenerationWorker

GRACE_SECONDS = 10


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: only ``localhost`` is known to stay on this machine
        return False


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not yet listening: connections are refused until it does)."""
    family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, telling the worker to stop the moment a signal arrives (uvicorn itself waits for
    the open responses, which would otherwise run to their ends first)."""

    def __init__(self, config: uvicorn.Config, worker: GenerationWorker):
        super().__init__(config)
        self.worker = worker
        self.stopped_by: int | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        self.worker.stop_accepting()
        super().handle_exit(sig, frame)


def serve(app, worker: GenerationWorker, sock: socket.socket, quiet: bool = False) -> int | None:
    """Run ``app`` on ``sock`` until a signal ends it; the signal's number (None when it ended otherwise).
    uvicorn may raise the signal again once it is done (its handlers restored), so the caller's handler for it
    can also be what ends this call."""
    config = uvicorn.Config(app, log_level="warning" if quiet else "info", access_log=not quiet,
                            timeout_graceful_shutdown=GRACE_SECONDS, server_header=False, lifespan="on")
    server = _Server(config, worker)
    server.run(sockets=[sock])
    return server.stopped_by
