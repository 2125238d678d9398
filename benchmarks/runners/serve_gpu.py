"""`anyfp4 serve` with batches on a GPU, against the runner's own batched decode, one run: random
Llama-3.1-8B-shaped NVFP4 weights (no checkpoint needed) behind the server's app over real HTTP (uvicorn on a
loopback port), a tokenizer from ``--tokenizer`` (a tokenizer directory with a chat template, its vocabulary
within the model's). Every prompt first alone, one after another (the texts to match, and one client's
rate); then ``--clients`` concurrent streaming chat clients twice (the first round captures the batch's CUDA
graphs), the second timed: every text against the same request alone, aggregate tok/s (completion tokens
over the round's wall time, prefill and HTTP included) next to the runner's in-process decode of the same
prompts as one batch (what ``anyfp4 bench --batch`` times); with ``--bench``, ``anyfp4 bench --batch N`` itself
in a second process afterwards.

    PYTHONPATH=src ANYFP4_PREFILL=chunked python benchmarks/runners/serve_gpu.py --tokenizer TOKENIZER_DIR --bench \\
        --out benchmarks/results/serve_gpu_h200.json

A row's bits depend on neither the batch's other prompts nor its length only with ``ANYFP4_PREFILL=chunked``
(README); under the default prefill the texts served together need not match those served alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_load.py beside this script
from serve_load import stream_chat  # noqa: E402

TOPICS = ["the sea", "a mountain", "bread", "a violin", "winter", "a city at night", "a garden", "rain",
          "a train", "the moon", "a library", "coffee", "a river", "a forest", "snow", "a market",
          "an old bridge", "a lighthouse", "a storm", "the desert", "a kite", "a clock", "a harbor", "a bee"]


def prompts(n: int) -> list[str]:
    """``n`` chat prompts of different lengths (so that a batch is left-padded)."""
    return [f"Write about {TOPICS[i % len(TOPICS)]}." + " Please be detailed." * (i % 5) for i in range(n)]


def run_server(app):
    """``app`` on a free loopback port in a thread: (port, stop function)."""
    import uvicorn

    from anyfp4.serve.server import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(60)
        sock.close()

    return sock.getsockname()[1], stop


def concurrent_round(port: int, asked: list[str], max_tokens: int) -> tuple[list[dict], float]:
    """Every prompt at once, a thread each (run in a process of its own: clients that parse their streams under
    the server's GIL would slow the server they measure)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(asked)) as pool:
        results = list(pool.map(lambda p: stream_chat(port, p, max_tokens), asked))
    return results, time.perf_counter() - t0


def runner_batch(session, asked: list[str], max_tokens: int) -> tuple[float, float]:
    """The runner's generation of ``asked`` as one batch, in-process, the second of two runs (the first
    captures): (decode tok/s: rows x (steps - 1) over the time from the first step's tokens to the last's;
    seconds from the call to the first tokens)."""
    from anyfp4.runtime.generate import SamplingParams, generate

    ids = [session.encode_chat([{"role": "user", "content": p}]) for p in asked]
    params = SamplingParams(max_new_tokens=max_tokens)
    rate = first = 0.0
    for _ in range(2):
        stamps, t0 = [], time.perf_counter()
        generate(session.model, ids, params, on_tokens=lambda _: stamps.append(time.perf_counter()))
        rate, first = len(ids) * (len(stamps) - 1) / (stamps[-1] - stamps[0]), stamps[0] - t0
    return rate, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of the script")
    ap.add_argument("--bench", action="store_true", help="also run `anyfp4 bench --batch CLIENTS` afterwards")
    ap.add_argument("--commit", help="the commit of the code that runs, for the report (default: git's HEAD; a "
                    "copy of the tree elsewhere may carry an older git)")
    ap.add_argument("--out", type=Path, default=Path("serve_gpu.json"))
    args = ap.parse_args()
    import torch

    from anyfp4.bench.random_model import random_model
    from anyfp4.runtime.session import Session, load_tokenizer
    from anyfp4.serve.app import create_app
    from anyfp4.serve.worker import GenerationWorker

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(args.arch, args.format, device, dtype, progress=False)
    tokenizer = load_tokenizer(args.tokenizer, model.args.vocab_size)
    session = Session(args.tokenizer, model.args, tokenizer, stop_token_ids=(), model=model)  # replies run to max
    asked = prompts(args.clients)
    worker = GenerationWorker(session, 4 * args.clients, max_batch=args.clients)
    port, stop = run_server(create_app(worker, "m"))
    try:
        alone = [stream_chat(port, p, args.max_tokens) for p in asked]
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as clients:
            clients.submit(concurrent_round, port, asked, args.max_tokens).result()  # captures the batch's graphs
            time.sleep(0.5)  # a generation is recorded once it returns, just after its clients have their replies
            first_round = list(worker.records)[len(asked):]
            together, wall = clients.submit(concurrent_round, port, asked, args.max_tokens).result()
            time.sleep(0.5)
            timed_round = list(worker.records)[len(asked) + len(first_round):]
    finally:
        stop()
    ok = [r.get("status") == 200 and r.get("done") and r.get("finish") == "length" for r in alone + together]
    tokens = sum(r.get("tokens") or 0 for r in together)
    alone_rates = [(r["tokens"] - 1) / r["decode_s"] for r in alone if r.get("decode_s")]
    report = {
        "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "commit": args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                text=True).stdout.strip(),
        "model": f"random:{args.arch}:{args.format}", "clients": args.clients, "max_tokens": args.max_tokens,
        "prefill": os.environ.get("ANYFP4_PREFILL", "auto"),  # texts match alone only with chunked (README)
        "all_completed": all(ok), "same_as_alone": sum(a.get("text") == b.get("text") for a, b in zip(alone, together)),
        "first_round_generations": [asdict(r) for r in first_round],
        "timed_round_generations": [asdict(r) for r in timed_round],
        "completion_tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall,
        "first_text_p50_s": sorted(r["first_s"] for r in together)[len(together) // 2],
        "one_client_decode_tok_s": sorted(alone_rates)[len(alone_rates) // 2],
    }
    report["runner_batch_decode_tok_s"], report["runner_batch_first_tokens_s"] = runner_batch(session, asked,
                                                                                             args.max_tokens)
    if args.bench:
        del session, model
        torch.cuda.empty_cache()
        bench = subprocess.run([sys.executable, "-m", "anyfp4", "bench", "--random-weights", args.arch, "--format",
                                args.format, "--batch", str(args.clients), "--device", args.device,
                                "--json"], capture_output=True, text=True)
        report["bench_batch_decode_tok_s"] = json.loads(bench.stdout)["decode_tok_s"] if bench.returncode == 0 \
            else f"failed: {bench.stderr.strip().splitlines()[-1:]}"
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
