"""``--max-batch``: greedy requests that wait together share one generation, each ending at its own limit, stop
token or stop string with the runner's text; sampled ones, and ones that would not fit the context together,
run alone; a cancelled row leaves the others going."""

import asyncio
import threading
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

import anyfp4.serve.worker as worker_module
from anyfp4.runtime.generate import SamplingParams
from anyfp4.serve.app import create_app
from anyfp4.serve.worker import Cancelled, Finished, GenerationWorker, Job, TextDelta
from serve_support import payloads, request, streamed


def recording_generate(monkeypatch) -> list[int]:
    """The number of prompts of every generation the worker starts."""
    sizes, real = [], worker_module.generate

    def recorded(model, prompts, params, on_tokens, compile_decode=False):
        sizes.append(len(prompts))
        return real(model, prompts, params, on_tokens, compile_decode=compile_decode)

    monkeypatch.setattr(worker_module, "generate", recorded)
    return sizes


def test_sixteen_concurrent_streams_share_one_generation_with_the_runners_texts(session, runner, monkeypatch):
    for name in ("GATHER_QUIET_SECONDS", "GATHER_MAX_SECONDS"):  # the gathering ends once all sixteen are queued
        monkeypatch.setattr(worker_module, name, 10.0)
    sizes = recording_generate(monkeypatch)
    cases = [("chat" if i % 2 else "completion", f"prompt {i} " + "ab" * i, 3 + i) for i in range(15)]
    stop_case = ("completion", "hello", 24)
    full = runner.text("hello", 24)
    stop = full[7:10]
    want = [(runner.text(p, n, chat=kind == "chat"), "length") for kind, p, n in cases]
    want.append((full[:full.index(stop)], "stop"))
    got: list = [None] * 16
    app = create_app(GenerationWorker(session, 16, max_batch=16), "tiny")
    with TestClient(app) as client:
        def run(i):
            kind, prompt, n = cases[i] if i < 15 else stop_case
            extra = {"stop": [stop]} if i == 15 else {}
            route, body = request(kind, prompt, max_tokens=n, temperature=0, stream=True, **extra)
            with client.stream("POST", route, json=body) as response:
                got[i] = streamed(payloads(response.iter_lines()))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert got == want
    assert sizes == [16]  # one generation of the sixteen


def jobs_and_worker(session, specs, max_batch=8):
    """Jobs queued on a worker (not started); ``specs``: (prompt, SamplingParams) pairs."""
    worker = GenerationWorker(session, 16, max_batch=max_batch)
    jobs = [Job(prompt, params, (), incremental=True) for prompt, params in specs]
    worker._jobs.extend(jobs)
    return worker, jobs


def test_which_queued_jobs_share_a_generation(session):
    async def check():
        context = session.args.max_position_embeddings
        greedy = session.with_stop_tokens(SamplingParams(max_new_tokens=4))
        sampled = replace(greedy, temperature=1.0, seed=1)
        other_stops = replace(greedy, stop_token_ids=greedy.stop_token_ids + (7,))
        too_long = replace(greedy, max_new_tokens=context - 2)  # fits alone, not beside a 3-token prompt
        worker, jobs = jobs_and_worker(session, [([1, 2], greedy), ([3], sampled), ([4, 5, 6], greedy),
                                                 ([8], other_stops), ([9] * 10, greedy), ([1], too_long)])
        jobs[4].cancel()
        assert worker._take() == [jobs[0], jobs[2]]  # greedy with the same stop tokens, in arrival order
        assert worker._take() == [jobs[1]]  # sampled: alone
        assert worker._take() == [jobs[3]]  # other stop tokens: nothing else shares them
        assert worker._take() == [jobs[5]]  # the cancelled job is dropped
        assert worker.waiting() == 0

    asyncio.run(check())


def test_the_context_limits_a_batch(session):
    async def check():
        context = session.args.max_position_embeddings
        long_reply = session.with_stop_tokens(SamplingParams(max_new_tokens=context - 4))
        short_reply = replace(long_reply, max_new_tokens=2)
        worker, jobs = jobs_and_worker(session, [([1, 2], long_reply), ([5] * 10, short_reply),
                                                 ([6] * 5, short_reply), ([7] * 4, short_reply)])
        assert worker._take() == [jobs[0], jobs[3]]  # 4 + (context - 4) fits; 10 or 5 tokens would not
        assert worker._take() == [jobs[1], jobs[2]]

    asyncio.run(check())


def test_a_cancelled_row_ends_and_the_others_get_their_texts(session, runner):
    async def check():
        params = [session.with_stop_tokens(SamplingParams(max_new_tokens=n)) for n in (5, 9, 7)]
        prompts = [session.encode(p) for p in ("hello", "a longer prompt here", "x")]
        worker, jobs = jobs_and_worker(session, list(zip(prompts, params)))
        batch = worker._take()
        assert batch == jobs
        jobs[1].cancel()
        await asyncio.to_thread(worker._generate, batch)
        await asyncio.sleep(0.05)  # the events pushed from the thread arrive
        events = [[job.events.get_nowait() for _ in range(job.events.qsize())] for job in jobs]
        return events

    events = asyncio.run(check())
    assert events[1] == [Cancelled()]
    for i, (prompt, n) in enumerate([("hello", 5), ("x", 7)]):
        row = events[0] if i == 0 else events[2]
        text = "".join(e.text for e in row if isinstance(e, TextDelta))
        assert isinstance(row[-1], Finished) and row[-1].reason == "length" and row[-1].completion_tokens == n
        assert text == row[-1].text == runner.text(prompt, n)


def test_a_lone_request_waits_only_the_quiet_gap(session, monkeypatch):
    """Gathering ends once no request came for GATHER_QUIET_SECONDS, well before GATHER_MAX_SECONDS."""
    import time

    monkeypatch.setattr(worker_module, "GATHER_QUIET_SECONDS", 0.05)
    monkeypatch.setattr(worker_module, "GATHER_MAX_SECONDS", 30.0)

    async def check():
        worker, jobs = jobs_and_worker(session, [([1, 2], session.with_stop_tokens(SamplingParams(max_new_tokens=2)))])
        t0 = time.monotonic()
        assert worker._take() == jobs
        return time.monotonic() - t0

    assert asyncio.run(check()) < 5.0


def test_setup_runs_on_the_generation_thread_and_its_error_reaches_the_caller(session):
    """``start(setup)``: what ``anyfp4 serve`` loads the weights with runs on the thread that then generates; a
    setup that fails raises in the caller, and a later start can try again."""
    seen = []
    worker = GenerationWorker(session, 4)

    def failing():
        seen.append(threading.current_thread().name)
        raise OSError("no such checkpoint")

    with pytest.raises(OSError, match="no such checkpoint"):
        worker.start(setup=failing)
    worker.start(setup=lambda: seen.append(threading.current_thread().name))
    try:
        assert seen == ["anyfp4-generation", "anyfp4-generation"]
    finally:
        worker.close(10)
