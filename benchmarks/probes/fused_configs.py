"""Tile configurations of NVFP4's fused Triton prefill GEMM (``kernels/triton/nvfp4_decode.nvfp4_fused_gemm``) by
shape and M, against bf16 ``F.linear`` in the same run, timed as the scoreboard times (CUDA-graph replays over
rotated weight copies): the source of ``dispatch.tuning``'s fused configs.

    PYTHONPATH=src python benchmarks/probes/fused_configs.py [--shapes 14336x4096 ...] [--ms 64 128 256] \
        [--budget-s 240] [--out fused_configs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # prefill_modes.py beside this script
from prefill_modes import scoreboard  # noqa: E402  (the scoreboard's shapes, arms and timing plans)

SHAPES = ("6144x4096", "28672x4096:gated", "14336x4096", "4096x14336", "28672x8192", "5120x1536")
# (block_m, block_n, block_k, num_warps, num_stages, split_k, swap_ab); block_k is 128 at least (the tiled code
# words)
CONFIGS = ((128, 128, 128, 8, 3, 1, False), (64, 128, 128, 4, 3, 1, False), (64, 64, 128, 4, 3, 1, False),
           (128, 64, 128, 4, 3, 1, False), (64, 64, 128, 4, 3, 2, False), (64, 64, 128, 4, 3, 4, False),
           (64, 128, 128, 4, 3, 2, False), (128, 128, 128, 8, 3, 2, False),
           # 256 rows a tile: half the decode work a multiply-add of 128 (sm_90 SASS: 16 wgmmas a K step against 8,
           # 396 instructions a warp against 313); two stages for the shared memory (172 KB)
           (256, 128, 128, 8, 2, 1, False), (256, 128, 128, 16, 2, 1, False),
           # the decoded tile as wgmma's register operand, so the next tile's decode overlaps the multiply in flight
           (128, 128, 128, 8, 3, 1, True), (128, 128, 128, 4, 3, 1, True), (64, 128, 128, 4, 3, 1, True),
           (64, 64, 128, 4, 3, 1, True), (256, 128, 128, 8, 2, 1, True), (256, 64, 128, 4, 3, 1, True),
           (64, 128, 128, 4, 3, 2, True), (64, 64, 128, 4, 3, 4, True))


def main() -> None:
    sb = scoreboard()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--ms", type=int, nargs="+", default=[48, 64, 128, 256, 1024])
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--configs", nargs="+",
                    help="only these configs, named as in the report (e.g. 256x128x128/w8/s2/k1)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="fused_configs.json")
    a = ap.parse_args()
    from anyfp4.bench.timing import graph_seconds
    from anyfp4.dispatch.configs import FusedConfig
    from anyfp4.kernels.triton.nvfp4_decode import nvfp4_fused_gemm

    t0 = time.monotonic()
    dev = torch.device("cuda")
    report = {"gpu": torch.cuda.get_device_name(), "commit": a.commit, "date": time.strftime("%Y-%m-%d"),
              "configs": "block_m x block_n x block_k / warps / stages / K slices [/ swap: the decoded tile as "
                         "wgmma's register operand]", "rows": []}
    for shape in a.shapes:
        if time.monotonic() - t0 > a.budget_s:
            report["skipped_after_budget"] = shape
            break
        n, k, gated = sb.parse_shape(shape)
        bf16_calls, _ = sb.bf16_arm(n, k, gated, dev)
        nv_calls, copies = sb.BUILDERS["anyfp4-nvfp4"](n, k, gated, dev)
        for m in a.ms:
            line = {"shape": shape, "m": m,
                    "bf16_us": graph_seconds(bf16_calls(m), **sb.timing_plan(m, copies)) * 1e6, "configs": {}}
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            for bm, bn, bk, warps, stages, split, swap in CONFIGS:
                key = f"{bm}x{bn}x{bk}/w{warps}/s{stages}/k{split}" + ("/swap" if swap else "")
                if a.configs and key not in a.configs:
                    continue
                cfg = FusedConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
                                  split_k=split, swap_ab=swap)
                try:
                    ps = nv_calls.prepacks
                    us = graph_seconds(lambda i: nvfp4_fused_gemm(x, ps[i % copies], None, cfg),
                                       **sb.timing_plan(m, copies)) * 1e6
                except Exception as e:  # a config the GPU cannot hold (shared memory): noted, not fatal
                    us = None
                    line.setdefault("errors", {})[key] = sb.error_note(e)
                line["configs"][key] = us
            timed = {c: u for c, u in line["configs"].items() if u}
            best = min(timed, key=timed.get)
            line["best"], line["best_x_bf16"] = best, line["bf16_us"] / timed[best]
            report["rows"].append(line)
            default = timed.get("128x128x128/w8/s3/k1", 0)
            plain = min((u for c, u in timed.items() if not c.endswith("/swap")), default=0)
            swapped = min((u for c, u in timed.items() if c.endswith("/swap")), default=0)
            print(f"{shape:>18} M={m:5d} best unswapped {plain:7.1f} us, swapped {swapped:7.1f}", flush=True)
            print(f"{shape:>18} M={m:5d} bf16 {line['bf16_us']:7.1f} us | default {default:7.1f}"
                  f" | best {best} {timed[best]:7.1f} ({line['best_x_bf16']:.2f}x bf16)", flush=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
