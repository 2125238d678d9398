"""For the tests: Server-Sent Events into payloads, payloads into text; an app served over real HTTP."""

import json
import threading
import time
from contextlib import contextmanager


def payloads(lines) -> list:
    """The ``data:`` payloads of an event stream, JSON decoded (``"[DONE]"`` kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"not an SSE line: {line!r}"
    return out


def streamed(events: list) -> tuple[str, str | None]:
    """(the text of a completed stream, its finish_reason); the stream must end with one reason and [DONE]."""
    assert events and events[-1] == "[DONE]", events[-3:]
    text, reasons = "", []
    for event in events[:-1]:
        assert "error" not in event, event
        for choice in event["choices"]:
            text += choice.get("text") or choice.get("delta", {}).get("content") or ""
            if choice["finish_reason"] is not None:
                reasons.append(choice["finish_reason"])
    assert len(reasons) == 1, reasons
    return text, reasons[0]


def reply_text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def request(kind: str, prompt: str, **fields) -> tuple[str, dict]:
    """(route, body) of a completion or a one-turn chat."""
    if kind == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **fields}
    return "/v1/completions", {"prompt": prompt, **fields}


@contextmanager
def live_server(app):
    """``app`` served by uvicorn on a free loopback port, in a thread of this process: real HTTP, real
    disconnects. Yields the base URL."""
    import uvicorn

    from anyfp4.serve.server import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
