"""How long one ``add_rms_norm`` launch of a decode row takes by its warps: a CUDA graph of a chain of launches
(each one's outputs the next one's inputs, early launch as the runner has it), replayed
(``bench.timing.graph_seconds``); per launch in us.

    python benchmarks/probes/norm_warps.py --cols 5120 --warps 2 4 8 16 --out norm_warps.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from anyfp4.bench.timing import graph_seconds
from anyfp4.kernels.glue.rms_norm import add_rms_norm_kernel
from anyfp4.kernels.triton.common import early_launch_args


def chain_us(cols: int, warps: int, launches: int) -> float:
    dev = torch.device("cuda")
    row = lambda scale: torch.randn(1, cols, device=dev, dtype=torch.bfloat16) * scale  # noqa: E731
    pairs = [(row(1.0), row(0.01)), (row(1.0), row(0.01))]  # (x, delta) in, (h, y) out, swapped every call
    w = torch.rand(cols, device=dev, dtype=torch.bfloat16)
    block = triton.next_power_of_2(cols)

    def call(i: int) -> None:  # call i adds and normalizes call i - 1's outputs
        (x, d), (h, y) = pairs[i % 2], pairs[1 - i % 2]
        add_rms_norm_kernel[(1,)](x, d, w, h, y, cols, cols, cols, cols, cols, 1e-6, BLOCK=block, INTERPRET=False,
                                  num_warps=warps, **early_launch_args(dev))

    return graph_seconds(call, reps=launches) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", type=int, nargs="+", default=[5120, 4096])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--launches", type=int, default=128)
    ap.add_argument("--out", default="norm_warps.json")
    args = ap.parse_args()
    rows = []
    for cols in args.cols:
        for rnd in range(2):
            for warps in args.warps:
                us = chain_us(cols, warps, args.launches)
                rows.append({"cols": cols, "warps": warps, "round": rnd, "us_per_launch": us})
                print(f"cols {cols} warps {warps} round {rnd}: {us:.2f} us a launch", flush=True)
    report = {"gpu": torch.cuda.get_device_name(), "command": "benchmarks/probes/norm_warps.py", "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
