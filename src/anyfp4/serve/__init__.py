"""``anyfp4 serve``: an OpenAI-compatible HTTP server over the embedded runner (FastAPI + uvicorn, the
``anyfp4[serve]`` extra), for machines vLLM does not reach: CPU-only installs, Volta / Turing GPUs, a quick
local endpoint.

    app.py       the routes: /health, /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE)
    schemas.py   the request bodies (pydantic) and what they may ask for
    replies.py   the OpenAI shapes of replies and stream chunks
    errors.py    OpenAI-style error bodies for every refusal
    guards.py    what a request must pass before any route: Host, API key, content type, body size
    worker.py    the generation queue and the one thread that owns the model
    text.py      a reply's text as its tokens come (runtime/reply_decode.py decodes them): what is safe to send,
                 where a stop string ends it
    server.py    the socket, uvicorn, and the signals that end it

Concurrency: one worker thread owns the model; requests wait in a bounded queue (full: 429) in arrival
order. By default it generates for one request at a time, because a batched row keeps its bits only where
every layer computes it as alone (README, "Concurrency": not the CPU's dense layers, e.g. a bf16 lm_head, nor
the GPU's default cuBLAS prefill), and a last-bit difference at a near tie changes a token. Served one at a
time, a greedy reply is the text ``anyfp4 generate`` prints for the same prompt and max_tokens, however many
clients there are. ``--max-batch N`` trades that for throughput: greedy requests
that wait together run as one batched generation (worker.py says which may share one). A client that
disconnects cancels its request: a queued one is dropped, a running one stops at its next token.
"""
