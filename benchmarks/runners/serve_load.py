"""`anyfp4 serve` under load on the CPU, one run (no GPU needed): the SmolLM2-135M-Instruct NVFP4 checkpoint of
``anyfp4 demo``, 64 concurrent streaming chat completions (greedy), every one checked against the same request
served alone; latency percentiles and throughput; and one client's decode rate (median of three 64-token streams)
next to the runner's own in-process (``generate`` as ``anyfp4 generate`` runs it, median of three after a warm-up).

    PYTHONPATH=src python benchmarks/runners/serve_load.py --out benchmarks/results/serve_load_cpu.json

Streams are read with the standard library (one thread per client, ``http.client``), so the numbers include no
client library's overhead.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPTS = ["What is the capital of France?", "Name three primary colors.", "Say hello in Spanish.",
           "What is 2 + 2?", "Give one use of a hammer.", "What color is the sky?", "Name a planet.",
           "What do bees make?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_chat(port: int, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy chat completion: its text, the time to its first and last text, and whether the stream
    ended as it should (a finish reason, then ``[DONE]``)."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text, first, last, finish, done, tokens = "", None, None, None, False, None
    if resp.status != 200:
        return {"status": resp.status, "error": resp.read().decode(errors="replace")}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            piece = choice.get("delta", {}).get("content") or ""
            if piece:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                text += piece
            finish = choice.get("finish_reason") or finish
    conn.close()
    end = time.perf_counter()
    return {"status": 200, "text": text, "tokens": tokens, "finish": finish, "done": done, "latency_s": end - t0,
            "first_s": (first - t0) if first is not None else None,
            "decode_s": (last - first) if first is not None else None}


def wait_healthy(port: int, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"anyfp4 serve exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("anyfp4 serve was not healthy in time")


def runner_rate(ckpt: Path, max_tokens: int) -> float:
    """The runner's decode tok/s for the same greedy chat reply as the single client's, in-process: the time from
    its first token to its last (the runner's ``generate`` with the checkpoint's stop tokens, as ``anyfp4
    generate`` runs it), median of three."""
    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.session import Session

    session = Session.load(ckpt, "cpu", "fp32", progress=False)
    ids = session.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    params = session.with_stop_tokens(SamplingParams(max_new_tokens=max_tokens))
    rates = []
    for _ in range(4):
        stamps = []
        out = generate(session.model, [ids], params, on_tokens=lambda _: stamps.append(time.perf_counter()))[0]
        rates.append((len(out) - 1) / (stamps[-1] - stamps[0]))
    return statistics.median(rates[1:])  # the first run warms up


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("serve_load_cpu.json"))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    from anyfp4.demo import smollm2_quantized

    ckpt = smollm2_quantized("nvfp4", progress=False)
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"anyfp4-serve-load-{port}.log"
    process = subprocess.Popen([sys.executable, "-m", "anyfp4", "serve", str(ckpt), "--device", "cpu", "--quiet",
                                "--port", str(port), "--max-queue", str(args.clients), "--served-model-name", "m"],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, process)
        alone = {p: stream_chat(port, p, args.max_tokens) for p in PROMPTS}
        singles = [stream_chat(port, PROMPTS[0], 64) for _ in range(3)]  # one client at a time, as the runner's
        requests = [PROMPTS[i % len(PROMPTS)] for i in range(args.clients)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(lambda p: stream_chat(port, p, args.max_tokens), requests))
        wall = time.perf_counter() - t0
    finally:
        process.terminate()
        code = process.wait(timeout=60)
    ok = [bool(r.get("status") == 200 and r.get("done") and r.get("finish")) for r in results]
    same = [r.get("text") == alone[p]["text"] for p, r in zip(requests, results)]
    latencies = [r["latency_s"] for r in results if r.get("status") == 200]
    firsts = [r["first_s"] for r in results if r.get("first_s") is not None]
    tokens = sum(r.get("tokens") or 0 for r in results)
    served_rates = [(r["tokens"] - 1) / r["decode_s"] for r in singles if r.get("decode_s")]
    served_rate = statistics.median(served_rates) if len(served_rates) == len(singles) else None
    report = {
        "date": time.strftime("%Y-%m-%d"), "cpu": platform.machine(), "cores": os.cpu_count(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "checkpoint": "SmolLM2-135M-Instruct NVFP4 (anyfp4 demo)", "clients": args.clients,
        "max_tokens": args.max_tokens, "completed": sum(ok), "same_as_alone": sum(same), "wall_s": wall,
        "completion_tokens": tokens, "aggregate_tok_s": tokens / wall,
        "latency_p50_s": percentile(latencies, 0.5), "latency_p99_s": percentile(latencies, 0.99),
        "first_text_p50_s": percentile(firsts, 0.5), "first_text_p99_s": percentile(firsts, 0.99),
        "one_client_decode_tok_s": served_rate, "one_client_runs_tok_s": served_rates,
        "runner_decode_tok_s": runner_rate(ckpt, 64),
        "server_exit_code": code, "server_log": str(log), "alone_texts": {p: r.get("text") for p, r in alone.items()},
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "alone_texts"}, indent=1))


if __name__ == "__main__":
    main()
