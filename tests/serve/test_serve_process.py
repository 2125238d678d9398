"""``python -m anyfp4 serve`` as a real process over real HTTP: replies stream as they are made, and SIGTERM
ends the server cleanly: every open request gets a proper end (an error its client can read), none is
lost, the process exits 143 with one line, as every command does."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import TINY_LLAMA, free_port, write_runnable_checkpoint
from serve_support import payloads

httpx = pytest.importorskip("httpx2")

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENDLESS = dict(TINY_LLAMA, max_position_embeddings=8192)  # no stop token, a long context: replies run long


def wait_for_health(base: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, process.stderr.read().decode()
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:  # not listening yet: the weights are loading
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)


class Client(threading.Thread):
    """One request in its own thread: its status, and its SSE payloads (stream) or JSON body."""

    def __init__(self, base: str, route: str, body: dict):
        super().__init__(daemon=True)
        self.base, self.route, self.body = base, route, body
        self.status, self.events, self.json, self.error = None, [], None, None
        self.start()

    def run(self):
        try:
            with httpx.Client(base_url=self.base, timeout=60) as client:
                if not self.body.get("stream"):
                    response = client.post(self.route, json=self.body)
                    self.status, self.json = response.status_code, response.json()
                    return
                with client.stream("POST", self.route, json=self.body) as response:
                    self.status = response.status_code
                    for line in response.iter_lines():
                        self.events += payloads([line])
        except Exception as error:  # a cut connection: what must never happen
            self.error = error


def test_sigterm_ends_every_open_request_properly_and_exits_143(tmp_path):
    model = write_runnable_checkpoint(tmp_path / "endless", ENDLESS, stop_tokens=False)
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, "-m", "anyfp4", "serve", str(model), "--port", str(port),
                                "--device", "cpu", "--quiet", "--max-tokens-limit", "8000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(base, process)
        running = Client(base, "/v1/completions", {"prompt": "hello", "max_tokens": 8000, "stream": True})
        deadline = time.monotonic() + 60
        while len(running.events) < 5:  # streamed as they are made: chunks long before the reply's end
            assert time.monotonic() < deadline and running.is_alive(), (running.status, running.error)
            time.sleep(0.01)
        queued = [Client(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 50, "stream": True}),
                  Client(base, "/v1/completions", {"prompt": "hi", "max_tokens": 50})]
        while httpx.get(f"{base}/health", timeout=5).json()["waiting"] < 2:  # both wait behind the running reply
            assert time.monotonic() < deadline, [(c.status, c.error) for c in queued]
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = process.stderr.read().decode()
    assert code == 143, err
    assert err.splitlines()[-1] == "anyfp4 serve: terminated", err
    for client in [running, *queued]:
        client.join(10)
        assert not client.is_alive() and client.error is None, (client.route, client.error)
    # the running reply: its text so far, then an error event and [DONE]
    assert running.status == 200 and running.events[-1] == "[DONE]"
    assert running.events[-2]["error"]["code"] == "shutting_down"
    assert any(e["choices"][0]["text"] for e in running.events[:-2])
    # the queued ones: a stream that had started (the chat role chunk) ends the same way; the other is a 503
    chat, plain = queued
    assert chat.status == 200 and chat.events[-1] == "[DONE]" and chat.events[-2]["error"]["code"] == "shutting_down"
    assert plain.status == 503 and plain.json["error"]["code"] == "shutting_down"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/health", timeout=2)
