"""The routes: ``/health`` (no key), ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (JSON,
or Server-Sent Events with ``stream: true``). A request is checked whole — its model, its parameters, its
prompt against the context — before it is queued; the model is fixed when the server starts, and a request's
``model`` is only ever compared with its name."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..runtime.generate import SamplingParams
from .errors import ApiError, error_body, install_handlers
from .guards import RequestGuard
from .replies import DONE, Reply, sse
from .schemas import ChatBody, CompletionBody, GenerationBody
from .worker import SHUTTING_DOWN, Failed, Finished, GenerationWorker, Job, QueueFull, ShuttingDown, TextDelta

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def default_body_limit(context: int) -> int:
    """Room for a prompt that fills the context, however it is spelled (32 bytes a token), and at least 4 MiB."""
    return max(4 << 20, 32 * context)


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def _stream(reply: Reply, job: Job, watcher: asyncio.Task, include_usage: bool):
    try:
        if reply.kind == "chat":
            yield sse(reply.chunk(role=True))
        while True:
            event = await job.next_event()
            if isinstance(event, TextDelta):
                yield sse(reply.chunk(event.text))
            elif isinstance(event, Finished):
                yield sse(reply.chunk(reason=event.reason))
                if include_usage:
                    yield sse(reply.usage_chunk(event.prompt_tokens, event.completion_tokens))
                break
            elif isinstance(event, Failed):
                yield sse(error_body(event.status, event.message, code=event.code))
                break
            else:  # cancelled: the client is gone
                return
        yield DONE
    finally:
        job.cancel()
        watcher.cancel()


async def _whole(reply: Reply, job: Job):
    while True:
        event = await job.next_event()
        if isinstance(event, Finished):
            return reply.whole(event.text, event.reason, event.prompt_tokens, event.completion_tokens)
        if isinstance(event, Failed):
            raise ApiError(event.status, event.message, code=event.code)
        if not isinstance(event, TextDelta):  # cancelled: the client is gone, nobody reads this
            return JSONResponse(error_body(499, "the client closed the request"), status_code=499)


def create_app(worker: GenerationWorker, served_name: str, api_key: str | None = None,
               max_tokens_limit: int = 1024, max_body_bytes: int | None = None,
               allowed_hosts: frozenset[str] | None = None) -> FastAPI:
    """The app over ``worker``'s model; the worker thread runs from the app's startup to its shutdown."""
    session = worker.session
    context = session.args.max_position_embeddings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            worker.close()

    app = FastAPI(title="anyfp4", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    install_handlers(app)
    app.add_middleware(RequestGuard, api_key=api_key, allowed_hosts=allowed_hosts,
                       max_body_bytes=max_body_bytes or default_body_limit(context))
    card = {"id": served_name, "object": "model", "created": int(time.time()), "owned_by": "anyfp4",
            "max_model_len": context}

    @app.get("/health")
    async def health():
        if worker.stopping:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return {"status": "ok", "waiting": worker.waiting()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != served_name:
            raise ApiError(404, f"no model {model_id!r} here: this server serves {served_name!r}", "model",
                           "model_not_found")
        return card

    def check(body: GenerationBody) -> None:
        if body.model is not None and body.model != served_name:
            raise ApiError(404, f"this server serves {served_name!r}, not {body.model!r}", "model",
                           "model_not_found")
        unsupported = body.unsupported()
        if unsupported:
            raise ApiError(400, f"'{unsupported}' is not supported by this server", unsupported, "unsupported")

    def sampling(body: GenerationBody, prompt: list[int], max_tokens: int | None, prompt_param: str,
                 max_tokens_param: str = "max_tokens"):
        if max_tokens is None:
            max_tokens = min(max_tokens_limit, context - len(prompt))
            if max_tokens < 1:
                raise ApiError(400, f"the prompt ({len(prompt)} tokens) fills the model's context of {context} "
                               "tokens", prompt_param, "context_length_exceeded")
        elif max_tokens > max_tokens_limit:
            raise ApiError(400, f"{max_tokens_param} {max_tokens} is over this server's limit of "
                           f"{max_tokens_limit}", max_tokens_param, "max_tokens_over_limit")
        params = session.with_stop_tokens(SamplingParams(
            max_new_tokens=max_tokens, temperature=body.temperature, seed=body.seed,
            top_p=None if body.top_p == 1 else body.top_p))
        try:
            session.check_fits([prompt], params)
        except ValueError as error:
            raise ApiError(400, str(error), prompt_param, "context_length_exceeded") from None
        return params

    async def respond(request: Request, reply: Reply, body: GenerationBody, prompt: list[int], params):
        stops = body.stop_strings()
        job = Job(prompt, params, stops, incremental=body.stream or bool(stops))
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(429, "the server is busy (its queue is full); try again later", code="queue_full") from None
        except ShuttingDown:
            raise ApiError(SHUTTING_DOWN.status, SHUTTING_DOWN.message, code=SHUTTING_DOWN.code) from None
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, job))
        if body.stream:
            return StreamingResponse(_stream(reply, job, watcher, body.include_usage()),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            return await _whole(reply, job)
        finally:
            job.cancel()
            watcher.cancel()

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        check(body)
        if isinstance(body.prompt, str):
            prompt = worker.encode(body.prompt)
        else:
            prompt = body.prompt
            if not all(0 <= t < session.args.vocab_size for t in prompt):
                raise ApiError(400, f"prompt token ids must be in [0, {session.args.vocab_size})", "prompt")
        max_tokens = body.max_tokens if body.max_tokens is not None else min(COMPLETION_DEFAULT_MAX_TOKENS,
                                                                             max_tokens_limit)
        params = sampling(body, prompt, max_tokens, "prompt")
        return await respond(request, Reply("completion", served_name), body, prompt, params)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        check(body)
        if getattr(session.tokenizer, "chat_template", None) is None:
            raise ApiError(400, "this model's tokenizer has no chat template: use /v1/completions", "messages",
                           "no_chat_template")
        try:
            prompt = worker.encode_chat([{"role": m.role, "content": m.content} for m in body.messages])
        except Exception as error:  # the template's own refusal (jinja raises its own types)
            raise ApiError(400, f"the chat template refused these messages: {error}", "messages") from None
        asked = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        params = sampling(body, prompt, body.asked_max_tokens(), "messages", asked)
        return await respond(request, Reply("chat", served_name), body, prompt, params)

    return app
