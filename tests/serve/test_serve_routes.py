"""The routes in process (FastAPI's TestClient): the runner's texts, alone and under 16 concurrent streams;
OpenAI-style errors for every malformed request, with the server serving on; the API key; the Host check."""

import json
import os
import threading
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

import anyfp4.serve.worker as worker_module
from anyfp4.cli import main
from anyfp4.serve.app import create_app
from anyfp4.serve.guards import LOOPBACK_NAMES
from anyfp4.runtime.session import Session
from anyfp4.serve.worker import GenerationWorker
from helpers import CHAT_TEMPLATE, hard_timeout, snapshot, write_runnable_checkpoint
from serve_support import payloads, reply_text, request, streamed

NAME = "tiny"  # the checkpoint directory's name: what `anyfp4 serve` calls it by default


@contextmanager
def serving(session, max_queue: int = 16, **options):
    app = create_app(GenerationWorker(session, max_queue), NAME, **options)
    with TestClient(app) as client:
        yield client


def stream_events(client, route: str, body: dict, headers=None) -> list:
    with client.stream("POST", route, json={**body, "stream": True}, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return payloads(response.iter_lines())


def assert_error(response, status: int, fragment: str = "", param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"], error
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_greedy_replies_are_the_runners_texts(session, runner, kind):
    prompts = ["hello", "The capital of France is", "x"]
    want = {p: runner.text(p, 12, chat=kind == "chat") for p in prompts}
    with serving(session) as client:
        for prompt in prompts:
            route, body = request(kind, prompt, model=NAME, max_tokens=12, temperature=0)
            whole = client.post(route, json=body)
            assert whole.status_code == 200, whole.text
            assert reply_text(whole.json()) == want[prompt]
            assert whole.json()["choices"][0]["finish_reason"] == "length"
            assert whole.json()["usage"]["completion_tokens"] == 12
            assert streamed(stream_events(client, route, body)) == (want[prompt], "length")


def test_a_completion_is_what_anyfp4_generate_prints(session, checkpoint, capsys):
    assert main(["generate", str(checkpoint), "--prompt", "hello", "--max-tokens", "16", "--device", "cpu",
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    with serving(session) as client:
        body = client.post("/v1/completions", json={"model": NAME, "prompt": "hello", "max_tokens": 16,
                                                    "temperature": 0}).json()
    assert reply_text(body) + "\n" == printed


def test_sixteen_concurrent_streams_get_the_runners_texts(session, runner):
    cases = [("chat" if i % 2 else "completion", f"prompt {i} " + "ab" * i, 6 + i) for i in range(16)]
    want = [runner.text(p, n, chat=kind == "chat") for kind, p, n in cases]
    got: list = [None] * len(cases)
    with serving(session, max_queue=16) as client:
        def run(i):
            kind, prompt, n = cases[i]
            got[i] = streamed(stream_events(client, *request(kind, prompt, max_tokens=n, temperature=0)))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert got == [(text, "length") for text in want]


def test_stop_strings_end_the_reply_before_them(session, runner):
    full = runner.text("hello", 24)
    stop = full[7:10]
    cut = full[:full.index(stop)]
    with serving(session) as client:
        body = {"model": NAME, "prompt": "hello", "max_tokens": 24, "temperature": 0, "stop": [stop, "never"]}
        whole = client.post("/v1/completions", json=body).json()
        assert (reply_text(whole), whole["choices"][0]["finish_reason"]) == (cut, "stop")
        assert whole["usage"]["completion_tokens"] < 24
        assert streamed(stream_events(client, "/v1/completions", body)) == (cut, "stop")


def test_seeded_sampling_is_reproducible_and_the_runners(session, runner):
    want = runner.text("hello", 16, temperature=0.8, top_p=0.9, seed=11)
    with serving(session) as client:
        body = {"prompt": "hello", "max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "seed": 11}
        texts = {reply_text(client.post("/v1/completions", json=body).json()) for _ in range(2)}
    assert texts == {want}


def test_usage_chunk_and_models(session):
    with serving(session) as client:
        events = stream_events(client, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3,
            "stream_options": {"include_usage": True}})
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3
        models = client.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == [NAME] and models["data"][0]["max_model_len"] == 256
        assert client.get(f"/v1/models/{NAME}").json()["id"] == NAME
        assert_error(client.get("/v1/models/other"), 404, "no model 'other'")
        assert client.get("/health").json() == {"status": "ok", "waiting": 0}


TOO_LONG = "a" * 300  # one token a character: over the 256-token context

MALFORMED = [
    # (raw body or JSON object, status, fragment of the message, param)
    (b"{", 400, "not valid JSON", None),
    (b"[1, 2]", 400, "must be a JSON object", None),
    (b"", 400, "", None),
    ({"prompt": "hi", "max_tokens": -1}, 400, "greater than or equal to 1", "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "greater than or equal to 1", "max_tokens"),
    ({"prompt": "hi", "max_tokens": 5000}, 400, "over this server's limit of 64", "max_tokens"),
    ({"prompt": "hi", "max_tokens": "5"}, 400, "valid integer", "max_tokens"),
    ({"prompt": "hi", "max_tokens": 2.0}, 400, "valid integer", "max_tokens"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "this server serves 'tiny', not 'gpt-4'", "model"),
    ({"prompt": "hi", "n": 2}, 400, "only n = 1 is supported", "n"),
    ({"prompt": "hi", "temperature": -0.5}, 400, "greater than or equal to 0", "temperature"),
    ({"prompt": "hi", "top_p": 0}, 400, "greater than 0", "top_p"),
    ({"prompt": "hi", "seed": -1}, 400, "", "seed"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop strings", "stop"),
    ({"prompt": "hi", "stop": ""}, 400, "must not be empty", "stop"),
    ({"prompt": "hi", "stream": "yes"}, 400, "valid boolean", "stream"),
    ({"prompt": "hi", "echo": True}, 400, "'echo' is not supported", "echo"),
    ({"prompt": "hi", "logprobs": 2}, 400, "'logprobs' is not supported", "logprobs"),
    ({"prompt": "hi", "presence_penalty": 0.5}, 400, "'presence_penalty' is not supported", "presence_penalty"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request", "prompt"),
    ({"prompt": 7}, 400, "a string, a list of one string or a list of token ids", "prompt"),
    ({"prompt": [1, 500]}, 400, "token ids must be in [0, 128)", "prompt"),
    ({"prompt": ""}, 400, "at least one token", "prompt"),
    ({"prompt": TOO_LONG, "max_tokens": 8}, 400, "exceeds the model's context of 256 tokens", "prompt"),
    ({}, 400, "Field required", "prompt"),
]

CHAT_MALFORMED = [
    ({"messages": []}, 400, "at least 1 item", "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "'system', 'user' or 'assistant'", "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "only text content", "messages[0].content"),
    ({"messages": [{"role": "user"}]}, 400, "Field required", "messages[0].content"),
    ({"messages": [{"role": "user", "content": TOO_LONG}]}, 400, "context of 256 tokens", "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, 400, "greater than or equal",
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "'tools'", "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 65}, 400, "over this server's limit",
     "max_completion_tokens"),
]


@pytest.mark.parametrize("route, body, status, fragment, param",
                         [("/v1/completions", *case) for case in MALFORMED]
                         + [("/v1/chat/completions", *case) for case in CHAT_MALFORMED])
def test_malformed_requests_get_openai_errors_and_serving_goes_on(session, route, body, status, fragment, param):
    with serving(session, max_tokens_limit=64) as client:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        for stream in (False, True):  # refused before any stream starts
            if stream and isinstance(body, dict) and body and "stream" not in body:
                content = json.dumps({**body, "stream": True}).encode()
            response = client.post(route, content=content, headers={"Content-Type": "application/json"})
            assert_error(response, status, fragment, param)
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_other_refusals(session):
    with serving(session) as client:
        assert_error(client.post("/v1/completions", content=b'{"prompt": "hi"}'), 415, "Content-Type: application/json")
        assert_error(client.post("/v1/completions", content=b'{"prompt": "hi"}', headers={"Content-Type": "text/plain"}),
                     415)
        assert_error(client.get("/v1/completions"), 405)
        assert_error(client.get("/v1/nothing"), 404)
        assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_a_model_naming_a_path_is_refused_without_touching_it(session, tmp_path, monkeypatch):
    other = write_runnable_checkpoint(tmp_path / "other")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block
    before = {path: snapshot(path) for path in (other,)}

    def refuse(*args, **kwargs):
        raise AssertionError("a request opened a checkpoint")

    monkeypatch.setattr("anyfp4.runtime.session.Session.open", refuse)
    monkeypatch.setattr("anyfp4.runtime.session.plan_checkpoint", refuse)
    monkeypatch.setattr("anyfp4.runtime.loader.load_planned", refuse)
    with serving(session) as client, hard_timeout(30):
        for name in (str(other), str(fifo), "../tiny", "/etc/passwd", f"{NAME}/../{NAME}"):
            for route, body in (request("completion", "hi", model=name), request("chat", "hi", model=name)):
                assert_error(client.post(route, json=body), 404, "this server serves 'tiny'", "model")
        assert_error(client.get(f"/v1/models{other}"), 404, "no model")
    assert {path: snapshot(path) for path in (other,)} == before


def test_an_oversized_body_gets_413_and_serving_goes_on(session):
    with serving(session, max_body_bytes=4096) as client:
        big = json.dumps({"prompt": "hi", "padding": "x" * 5000}).encode()
        assert_error(client.post("/v1/completions", content=big, headers={"Content-Type": "application/json"}),
                     413, "over this server's limit of 4096 bytes")
        chunked = (big[i:i + 1000] for i in range(0, len(big), 1000))  # no Content-Length: counted as it comes
        assert_error(client.post("/v1/completions", content=chunked, headers={"Content-Type": "application/json"}),
                     413)
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


ROUTES = [("GET", "/v1/models", None), ("GET", f"/v1/models/{NAME}", None), ("GET", "/v1/nothing", None),
          ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
          ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})]


def test_with_an_api_key_every_route_but_health_needs_it(session):
    with serving(session, api_key="s3cret") as client:
        assert client.get("/health").status_code == 200
        for method, route, body in ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                            {"Authorization": "Basic s3cret"}, {"Authorization": "Bearer s3cret-and-more"}):
                response = client.request(method, route, json=body, headers=headers)
                assert_error(response, 401, "a valid API key is required")
                assert response.headers["www-authenticate"] == "Bearer"
            ok = client.request(method, route, json=body, headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == (404 if route == "/v1/nothing" else 200), ok.text


def test_a_loopback_server_answers_only_to_loopback_host_names(session):
    with serving(session, allowed_hosts=LOOPBACK_NAMES) as client:
        for host, status in (("localhost:8000", 200), ("127.0.0.1:8000", 200), ("[::1]:8000", 200), ("LOCALHOST", 200),
                             ("attacker.example:8000", 400), ("localhost.attacker.example", 400), ("", 400)):
            response = client.get("/v1/models", headers={"Host": host})
            assert response.status_code == status, host
        assert_error(response, 400, "this server answers to 127.0.0.1, ::1, localhost, not to Host ''")


def test_a_failed_generation_is_a_500_and_serving_goes_on(session, monkeypatch):
    real, calls = worker_module.generate, []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory, say")
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_module, "generate", fails_once)
    with serving(session) as client:
        assert_error(client.post("/v1/completions", json={"prompt": "hi"}), 500, "RuntimeError: out of memory")
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


STRICT_TEMPLATE = ("{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the assistant cannot speak first') }}"
                   "{% endif %}" + CHAT_TEMPLATE)


@pytest.mark.parametrize("template, messages, status, fragment", [
    (None, [{"role": "user", "content": "hi"}], 400, "no chat template: use /v1/completions"),
    (STRICT_TEMPLATE, [{"role": "assistant", "content": "hi"}], 400, "the assistant cannot speak first"),
    (STRICT_TEMPLATE, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], 200, ""),
])
def test_the_checkpoints_chat_template_decides(tmp_path, template, messages, status, fragment):
    own = Session.load(write_runnable_checkpoint(tmp_path / "tiny", chat_template=template), "cpu", "fp32",
                       progress=False)
    with serving(own) as client:
        response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        if status != 200:
            assert_error(response, status, fragment, "messages")
        else:
            assert response.status_code == 200, response.text
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
