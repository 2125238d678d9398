"""Instructions per main-loop step of the CUDA decode kernel, on the CPU: compile one variant for sm_90 with
NVRTC, disassemble it with ``cuobjdump`` (from PATH or the ``nvidia-cuda-cuobjdump`` wheel:
``pip download --no-deps nvidia-cuda-cuobjdump`` and unzip, then ``--cuobjdump path``), and count the
instructions between two groups of mmas — one step of 64 NVFP4 weights (32 FP8) per thread — leaving out the
activation-staging block between the two ``BAR.SYNC``s. At M = 1 the kernel is issue-bound, so this count
tracks its speed (benchmarks/NOTES.md: ~225 per step row-major, ~180 with the pair layout).

    python benchmarks/probes/sass_count.py [--fp8] [--fp16] [--depth 4] [--warps 8] [--cuobjdump PATH]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from anyfp4.kernels import nvrtc, weight_mma  # noqa: E402


def step_counts(sass: str, mmas_per_step: int) -> tuple[int, collections.Counter]:
    ins = [line.split("*/", 1)[1].strip().rstrip(";").strip() for line in sass.splitlines()
           if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    mma = [i for i, line in enumerate(ins) if "HMMA" in line]
    if len(mma) < 2 * mmas_per_step:
        raise SystemExit(f"expected at least {2 * mmas_per_step} mmas, found {len(mma)}")
    step = ins[mma[mmas_per_step]:mma[2 * mmas_per_step]]  # the second unrolled step
    bars = [i for i, line in enumerate(step) if "BAR.SYNC" in line]
    if len(bars) >= 2:
        step = step[:bars[0]] + step[bars[-1] + 1:]
    ops = collections.Counter((line.split()[1] if line.startswith("@") else line.split()[0]).split(".")[0]
                              for line in step)
    return len(step), ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--fp16", action="store_true", help="fp16 activations (default bf16)")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    args = ap.parse_args()
    if not args.cuobjdump:
        raise SystemExit("cuobjdump not found: pass --cuobjdump (see the docstring)")
    defines = dict(EARLY=1, SPLIT=1, OUT_F32=0, FP8=int(args.fp8), NT=1, MT=1, WARPS=args.warps, DEPTH=args.depth,
                   BF16=int(not args.fp16), GATED=0, HAS_BIAS=0)
    cubin = nvrtc.compile_cubin(weight_mma._source(), weight_mma.KERNEL, 90, defines)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([args.cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    n, ops = step_counts(sass, 4 if args.fp8 else 8)
    weights = 32 if args.fp8 else 64
    print(f"{n} instructions per step ({n / weights:.2f} per weight): " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
