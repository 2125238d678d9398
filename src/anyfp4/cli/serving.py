"""``anyfp4 serve``: every check that needs no weights, then the weights, then the server until a signal
ends it (exit code 143 for SIGTERM, 130 for Ctrl-C, as for every command, once the open requests have
ended: see ``serve/server.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import InputError, Terminated


def _require_serve_extra() -> None:
    import importlib.util

    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"anyfp4 serve needs {' and '.join(missing)}: pip install 'anyfp4[serve]'")


def served_name(model: str) -> str:
    """The default name clients ask for: the checkpoint directory's name."""
    return Path(model).resolve().name or model


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from ..env import serve_api_key
    from ..runtime.session import Session, pick_device
    from .commands import threads_for

    _require_serve_extra()
    if args.api_key is not None and not args.api_key.strip():
        raise InputError("--api-key is empty")
    api_key = args.api_key.strip() if args.api_key is not None else serve_api_key()
    device = threads_for(pick_device(args.device))
    session = Session.open(args.model, compile_decode=args.compile)
    name = args.served_model_name or served_name(args.model)

    from ..serve.app import create_app
    from ..serve.guards import LOOPBACK_NAMES, host_name
    from ..serve.server import bind, is_loopback, serve
    from ..serve.worker import GenerationWorker

    loopback = is_loopback(args.host)
    sock = bind(args.host, args.port)  # before the weights: a port in use fails now
    try:
        if not loopback and api_key is None:
            print(f"anyfp4 serve: warning: listening on {args.host} without an API key: anyone who reaches this "
                  "address can use the model (set ANYFP4_API_KEY or --api-key)", file=sys.stderr, flush=True)
        worker = GenerationWorker(session, args.max_queue, args.max_batch)
        worker.start(setup=lambda: session.load_weights(device, args.dtype, progress=not args.quiet))
        app = create_app(worker, name, api_key, args.max_tokens_limit,
                         allowed_hosts=LOOPBACK_NAMES | {host_name(args.host)} if loopback else None)
        dtype = str(session.model.dtype).replace("torch.", "")
        host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
        print(f"anyfp4 serve: {name} ({device.type}, {dtype}) on http://{host}:{args.port}/v1"
              + (", API key required" if api_key else ""), file=sys.stderr, flush=True)
        stopped_by = serve(app, worker, sock, quiet=args.quiet)
    finally:
        sock.close()
    if stopped_by == signal.SIGTERM:
        raise Terminated
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt
    return 0
