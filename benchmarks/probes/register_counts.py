"""Registers, spills and stack of the CUDA decode kernel's variants per architecture, from ptxas through NVRTC (no
GPU needed): every flag value on every architecture, fp16 and bf16 (bf16 from sm_80), at the launch families the
tables use (M = 1..32 as n8 tiles, 4 and 8 warps, depths 2..8).

    PYTHONPATH=src python benchmarks/probes/register_counts.py --sms 75 80 90 --out register_counts.json
    ANYFP4_NVRTC=.../libnvrtc.so.12 PYTHONPATH=src python benchmarks/probes/register_counts.py --sms 70 ...

(CUDA 13's NVRTC refuses sm_70: ``ANYFP4_NVRTC`` points at CUDA 12's, e.g. from the nvidia-cuda-nvrtc-cu12 wheel.)
"""

from __future__ import annotations

import argparse
import json
import re

from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.cuda.weight_mma_defines import source_defines

# (FP8, NT, MT, WARPS, DEPTH, GATED, HAS_BIAS, KW)
FAMILIES = [(0, 1, 1, 8, 2, 0, 0, 1), (0, 1, 1, 8, 4, 1, 0, 1), (0, 2, 1, 8, 2, 0, 1, 2), (0, 4, 1, 4, 2, 0, 0, 1),
            (0, 1, 2, 8, 2, 0, 0, 4), (0, 1, 1, 4, 8, 0, 0, 1), (1, 1, 1, 8, 2, 0, 0, 1), (1, 1, 1, 8, 4, 1, 0, 8),
            (1, 2, 2, 4, 4, 0, 1, 1), (1, 4, 1, 8, 2, 0, 0, 2)]


def report(sm: int, fp8: int, nt: int, mt: int, warps: int, depth: int, gated: int, bias: int, kw: int,
           bf16: int) -> dict:
    defines = dict(source_defines("fp8" if fp8 else "nvfp4", "bf16" if bf16 else "fp16"), FP8=fp8, NT=nt, MT=mt,
                   WARPS=warps, DEPTH=depth, BF16=bf16, GATED=gated, HAS_BIAS=bias, OUT_F32=0, EARLY=int(sm >= 90),
                   VEC_X=1, SPLIT=4, KW=kw, **weight_mma.arch_defines(sm))
    log = nvrtc.ptxas_report(weight_mma.source_text(), weight_mma.KERNEL, sm, defines)
    numbers = {key: int(m.group(1)) if (m := re.search(pattern, log)) else None for key, pattern in (
        ("registers", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
        ("spill_loads", r"(\d+) bytes spill loads"), ("stack", r"(\d+) bytes stack frame"))}
    return {"sm": sm, "format": "fp8" if fp8 else "nvfp4", "act": "bf16" if bf16 else "fp16", "nt": nt, "mt": mt,
            "warps": warps, "depth": depth, "gated": gated, "bias": bias, "kw": kw, **numbers}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", nargs="+", type=int, default=[75, 80, 90])
    ap.add_argument("--out", default="register_counts.json")
    a = ap.parse_args()
    rows = []
    for sm in a.sms:
        for fam in FAMILIES:
            for bf16 in (0, 1) if sm >= weight_mma.ASYNC_SM else (0,):
                r = report(sm, *fam, bf16)
                rows.append(r)
                print(f"sm_{sm} {r['format']} {r['act']} nt={r['nt']} mt={r['mt']} warps={r['warps']} "
                      f"depth={r['depth']} gated={r['gated']} kw={r['kw']}: {r['registers']} registers, "
                      f"{r['spill_stores']} / {r['spill_loads']} bytes spilled, {r['stack']} stack")
    with open(a.out, "w") as f:
        json.dump({"nvrtc": ".".join(map(str, nvrtc.version())), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
