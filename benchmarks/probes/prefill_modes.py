"""Which prefill kernel wins at which M: the NVFP4 and FP8 ops at prefill M with each ``ANYFP4_PREFILL`` mode
(``cublas``: dequantize + cuBLAS; ``chunked``: the CUDA decode kernel ``limits.MMA_CHUNK_ROWS`` rows at a time,
``chunked32``: 32 at a time; ``fused``: NVFP4's Triton GEMM), against bf16 ``F.linear``, timed as the scoreboard
times (``kernels/scoreboard.py``: CUDA-graph replays over rotated weight copies), on the scoreboard's shapes.

    PYTHONPATH=src python benchmarks/probes/prefill_modes.py [--shapes 28672x8192 ...] [--ms 48 64 96 128] \
        [--modes cublas chunked chunked32 fused] [--out prefill_modes.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def scoreboard():
    spec = importlib.util.spec_from_file_location("scoreboard", HERE.parent / "kernels" / "scoreboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    sb = scoreboard()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(sb.SHAPES))
    ap.add_argument("--ms", type=int, nargs="+", default=[48, 64, 96, 128, 256, 1024])
    ap.add_argument("--modes", nargs="+", default=["cublas", "chunked", "fused"])
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "fp8"])
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="prefill_modes.json")
    a = ap.parse_args()
    from anyfp4.bench.timing import graph_seconds
    from anyfp4.kernels.cuda import weight_mma

    wide = weight_mma.MMA_CHUNK_ROWS

    t0 = time.monotonic()
    dev = torch.device("cuda")
    report = {"gpu": torch.cuda.get_device_name(), "commit": a.commit,
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "rows": []}
    for shape in a.shapes:
        if time.monotonic() - t0 > a.budget_s:
            report["skipped_after_budget"] = shape
            break
        n, k, gated = sb.parse_shape(shape)
        arms = {"bf16": sb.bf16_arm(n, k, gated, dev)}
        for fmt in a.formats:
            arms[fmt] = sb.BUILDERS[f"anyfp4-{fmt}"](n, k, gated, dev)
        for m in a.ms:
            line = {"shape": shape, "m": m}
            calls_for, copies = arms["bf16"]
            line["bf16_us"] = graph_seconds(calls_for(m), **sb.timing_plan(m, copies)) * 1e6
            for fmt in a.formats:
                calls_for, copies = arms[fmt]
                for mode in a.modes:
                    if mode == "fused" and fmt != "nvfp4":
                        continue
                    os.environ["ANYFP4_PREFILL"] = "chunked" if mode == "chunked32" else mode  # read in the op
                    weight_mma.MMA_CHUNK_ROWS = 32 if mode == "chunked32" else wide  # the chunks' rows, at capture
                    try:
                        us = graph_seconds(calls_for(m), **sb.timing_plan(m, copies)) * 1e6
                    finally:
                        os.environ.pop("ANYFP4_PREFILL")
                        weight_mma.MMA_CHUNK_ROWS = wide
                    line[f"{fmt}_{mode}_us"] = us
            report["rows"].append(line)
            cells = " ".join(f"{key[:-3]} {v:8.1f} ({line['bf16_us'] / v:4.2f}x)" for key, v in line.items()
                             if key.endswith("_us") and key != "bf16_us")
            print(f"{shape:>18} M={m:<5} bf16 {line['bf16_us']:8.1f} us | {cells}", flush=True)
        del arms
        torch.cuda.empty_cache()
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
