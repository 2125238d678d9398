"""Over real HTTP (uvicorn in a thread of this process), where a client can leave: a disconnect cancels its
generation at the next token, and a full queue answers 429 while the others are served."""

import threading
from contextlib import contextmanager

import pytest

import anyfp4.serve.worker as worker_module
from anyfp4.serve.app import create_app
from anyfp4.serve.worker import GenerationWorker, Job
from serve_support import live_server, payloads, request, streamed

httpx = pytest.importorskip("httpx2")

# How long a test waits for the worker thread to reach a point: on a loaded 2-CPU machine it once took over 10 s to
# start a generation (a whole-suite CI run); an event's wait returns as soon as it is set.
EVENT_WAIT_S = 60


@contextmanager
def held_generation(monkeypatch):
    """Generations pause before their first token until ``release`` is set; ``steps`` counts the tokens each
    reached; ``entered`` is set when one starts, ``cancelled`` when a job is cancelled."""
    real_generate, real_cancel = worker_module.generate, Job.cancel
    state = {"steps": [], "entered": threading.Event(), "release": threading.Event(),
             "cancelled": threading.Event()}

    def held(model, prompts, params, on_tokens, compile_decode=False):
        state["steps"].append(0)
        index = len(state["steps"]) - 1
        state["entered"].set()

        def step(tokens):
            assert state["release"].wait(2 * EVENT_WAIT_S)
            state["steps"][index] += 1
            on_tokens(tokens)

        return real_generate(model, prompts, params, step, compile_decode=compile_decode)

    def cancel(job):
        real_cancel(job)
        state["cancelled"].set()

    monkeypatch.setattr(worker_module, "generate", held)
    monkeypatch.setattr(Job, "cancel", cancel)
    try:
        yield state
    finally:
        state["release"].set()


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_cancels_the_generation(session, monkeypatch, stream):
    app = create_app(GenerationWorker(session, 4), "tiny")
    with held_generation(monkeypatch) as held, live_server(app) as base, httpx.Client(base_url=base) as client:
        route, body = request("chat", "hi", max_tokens=200, stream=stream)
        if stream:
            with client.stream("POST", route, json=body) as response:
                assert next(response.iter_lines()).startswith("data: ")  # the role chunk: the stream is open
                assert held["entered"].wait(EVENT_WAIT_S)
        else:
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
                client.post(route, json=body, timeout=httpx.Timeout(10, read=1.0))
            assert held["entered"].wait(EVENT_WAIT_S)
        assert held["cancelled"].wait(EVENT_WAIT_S)  # the server saw the client leave
        held["release"].set()
        after = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
    assert held["steps"] == [1, 3]  # the first stopped at its next token


def test_a_full_queue_gets_429_and_the_others_are_served(session, monkeypatch):
    app = create_app(GenerationWorker(session, 1), "tiny")
    route, body = request("chat", "hi", max_tokens=4, temperature=0, stream=True)
    with held_generation(monkeypatch) as held, live_server(app) as base, \
            httpx.Client(base_url=base, timeout=30) as first, httpx.Client(base_url=base, timeout=30) as second:
        with first.stream("POST", route, json=body) as running:
            running_lines = running.iter_lines()
            assert next(running_lines).startswith("data: ")
            # the worker took the first job off the queue (before that, the queue of one is full)
            assert held["entered"].wait(EVENT_WAIT_S) and held["steps"] == [0]
            with second.stream("POST", route, json=body) as waiting:
                waiting_lines = waiting.iter_lines()
                assert next(waiting_lines).startswith("data: ")  # one generates, one waits
                refused = httpx.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
                assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
                held["release"].set()
                first_reply, second_reply = streamed(payloads(running_lines)), streamed(payloads(waiting_lines))
                assert first_reply == second_reply and first_reply[1] == "length"
    assert held["steps"] == [4, 4]
