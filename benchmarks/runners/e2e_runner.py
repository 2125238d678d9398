"""The embedded runner end to end on a GPU, in one process: random-weight Llama-3.1-8B-shaped models in
NVFP4, FP8 and bf16; decode tok/s at batch 1, 4, 16 (CUDA-graph decode steps), prefill tok/s at 2048
prompt tokens, achieved weight bandwidth and its % of the copy bandwidth measured in the same run;
determinism (five greedy runs of 256 tokens, and the Triton kernels with the activation pack on and
off); and the verify-pass cost per M = 1..8 (what speculative decoding pays per step).

    PYTHONPATH=src python benchmarks/runners/e2e_runner.py --out e2e.json [--arch llama-3.1-8b]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from anyfp4.bench.model import bench_model, verify_pass_ms
from anyfp4.bench.random_model import random_model
from anyfp4.bench.timing import copy_bandwidth
from anyfp4.runtime.generate import forget_decode_graphs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="e2e.json")
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "fp8", "bf16"])
    args = ap.parse_args()
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": args.arch,
              "copy_GBps": copy_bandwidth(device) / 1e9, "runs": [], "verify_ms": {}, "determinism": {}}
    save = lambda: Path(args.out).write_text(json.dumps(report, indent=1))  # noqa: E731
    print(f"copy {report['copy_GBps']:.0f} GB/s", flush=True)
    for fmt in args.formats:
        t0 = time.time()
        model = random_model(args.arch, fmt, device, torch.bfloat16, progress=False)
        print(f"{fmt}: model built in {time.time() - t0:.1f} s", flush=True)
        for batch, prompt_len, gen_len in ((1, 128, 128), (4, 128, 128), (16, 128, 128), (1, 2048, 8)):
            r = bench_model(model, prompt_len, gen_len, batch)
            r.update(format=fmt, pct_copy=100 * r["bandwidth_GBps"] / report["copy_GBps"])
            report["runs"].append(r)
            print(f"{fmt} b={batch} p={prompt_len}: decode {r['decode_tok_s']:.1f} tok/s ({r['ms_per_step']:.2f} "
                  f"ms/step, {r['bandwidth_GBps']:.0f} GB/s = {r['pct_copy']:.0f}% copy), prefill "
                  f"{r['prefill_tok_s']:.0f} tok/s", flush=True)
            save()
        if fmt == "nvfp4":
            shas = [bench_model(model, 128, 256, 1)["sha256"] for _ in range(5)]
            report["determinism"]["cuda_5_runs"] = shas
            for kernels, pack in (("triton", "0"), ("triton", "1")):
                os.environ["ANYFP4_KERNELS"], os.environ["ANYFP4_ACT_PACK"] = kernels, pack
                forget_decode_graphs(model)
                report["determinism"][f"{kernels}_pack{pack}"] = bench_model(model, 128, 256, 1)["sha256"]
            os.environ["ANYFP4_KERNELS"], os.environ["ANYFP4_ACT_PACK"] = "auto", "auto"
            forget_decode_graphs(model)
            print("determinism", json.dumps(report["determinism"]), flush=True)
        if fmt in ("nvfp4", "bf16"):
            v = verify_pass_ms(model)
            report["verify_ms"][fmt] = v
            print(f"{fmt} verify ms per M: " + " ".join(f"{m}:{t:.3f}({t / v[1]:.2f}x)" for m, t in v.items()),
                  flush=True)
        save()
        del model
        torch.cuda.empty_cache()
    by = {(r["format"], r["batch"], r["prompt_len"]): r for r in report["runs"]}
    for fmt in args.formats:
        if fmt != "bf16" and (fmt, 1, 128) in by and ("bf16", 1, 128) in by:
            for batch in (1, 4, 16):
                a, b = by.get((fmt, batch, 128)), by.get(("bf16", batch, 128))
                if a and b:
                    print(f"{fmt} vs bf16 decode b={batch}: {a['decode_tok_s'] / b['decode_tok_s']:.2f}x", flush=True)
            a, b = by.get((fmt, 1, 2048)), by.get(("bf16", 1, 2048))
            print(f"{fmt} vs bf16 prefill 2048: {a['prefill_tok_s'] / b['prefill_tok_s']:.2f}x", flush=True)
    save()


if __name__ == "__main__":
    main()
