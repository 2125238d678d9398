"""The CPU kernels of an earlier revision of ``weight_cpu.c`` against this tree's, alternated in one run, one
thread, weights rotated from DRAM, bf16 rows (what vLLM's CPU build feeds the plugin), best of ``--trials``.

    PYTHONPATH=src python benchmarks/kernels/cpu_revisions.py --before 3a7f705 \\
        --out benchmarks/results/cpu_revisions.json [--shapes 3072x576 ...] [--ms 1 4 6 8 16]

Each (shape, M, format) row: us per call of each build, their ratio, and whether both gave the same bits (a change
that keeps a row's sums must: the run stops if they differ). The builds' ``features`` (AMX tiles or the bf16 dot
products) and the CPU's model name are recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from anyfp4.bench.random_weights import random_fp8, random_nvfp4
from anyfp4.kernels.cpu import linear as cpu_linear
from anyfp4.packing.fp8 import prepack_fp8
from anyfp4.packing.nvfp4 import prepack_nvfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_amx.py beside this script
from cpu_amx import best_us  # noqa: E402  (a call's best time over weight copies from DRAM)

SHAPES = ["3072x576", "576x1536", "960x576"]
ROTATE_BYTES = 24 << 20
SOURCE_PATH = "src/anyfp4/kernels/cpu/weight_cpu.c"


def builds(before: str, tmp: Path) -> dict:
    cc = cpu_linear._compiler()
    if cc is None:
        raise SystemExit("cpu_revisions: no C compiler")
    old = tmp / "weight_cpu.c"
    old.write_text(subprocess.run(["git", "show", f"{before}:{SOURCE_PATH}"], capture_output=True, text=True,
                                  check=True).stdout)
    return {"before": cpu_linear.open_library(cpu_linear._build(cc, tmp / "before", source_file=old)),
            "after": cpu_linear.open_library(cpu_linear._build(cc, tmp / "after"))}


def short(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True).stdout.strip()


def call(lib, fmt: str, x: torch.Tensor, w) -> torch.Tensor:
    if fmt == "nvfp4":
        return cpu_linear.nvfp4_rows(lib, x, w, (0,), 1.0)
    return cpu_linear.fp8_rows(lib, x, w, (0,), True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a git revision whose weight_cpu.c is the baseline")
    ap.add_argument("--out", default="cpu_revisions.json")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 4, 6, 8, 16])
    ap.add_argument("--trials", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = builds(args.before, Path(tmp))
        result = {"cpu": cpu_linear.cpu_model(), "before": short(args.before), "after": short("HEAD"),
                  "date": time.strftime("%Y-%m-%d"), "features": {k: cpu_linear.features(v) for k, v in libs.items()},
                  "threads": 1, "rows": []}
        for shape in args.shapes:
            n, k = map(int, shape.split("x"))
            weights = {"nvfp4": [prepack_nvfp4(random_nvfp4(n, k, "cpu", gen))
                                 for _ in range(max(2, ROTATE_BYTES // (n * k // 2 + n * k // 16)))],
                       "fp8": [prepack_fp8(random_fp8(n, k, "cpu", gen, per_channel=True))
                               for _ in range(max(2, ROTATE_BYTES // (n * k)))]}
            for m in args.ms:
                x = torch.randn(m, k, generator=gen).bfloat16()
                for fmt, copies in weights.items():
                    best = {name: float("inf") for name in libs}
                    for _ in range(args.trials):  # the builds alternate, so drift of the machine hits both
                        for name, lib in libs.items():
                            best[name] = min(best[name], best_us(lib, fmt, x, copies, 1))
                    same = torch.equal(*(call(lib, fmt, x, copies[0]) for lib in libs.values()))
                    row = {"format": fmt, "n": n, "k": k, "m": m, "before_us": best["before"],
                           "after_us": best["after"], "before_over_after": best["before"] / best["after"],
                           "same_bits": same}
                    result["rows"].append(row)
                    print(f"{shape} M={m} {fmt}: before {best['before']:.0f} us, after {best['after']:.0f} us "
                          f"({row['before_over_after']:.2f}x), same bits: {same}", flush=True)
                    if not same:
                        raise SystemExit("cpu_revisions: the two builds gave different bits")
                Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
