"""Instructions per main-loop step of the CUDA decode kernel, on the CPU: compile one variant for sm_90 with
NVRTC, disassemble it with ``cuobjdump`` (from PATH or the ``nvidia-cuda-cuobjdump`` wheel, which also needs
``nvidia-cuda-nvdisasm``: ``pip download --no-deps`` both and unzip, then ``--cuobjdump path``), and count one
step of 64 NVFP4 weights (32 FP8) per thread, leaving out the activation-staging block between two
``BAR.SYNC``s. Two counts: ``loop``, the kernel's loop over whole passes of its ring of code words divided by
its steps (everything the loop issues, loads and loop control included; kernels whose main loop is one such
loop), and ``window``, the instructions between the second and third group of a step's mmas (what one step
issues where every step carries its own loads and control, as before the loop over whole passes). At M = 1 the
kernel is issue-bound, so these track its speed (benchmarks/NOTES.md).

    PYTHONPATH=src python benchmarks/probes/sass_count.py [--fp8] [--fp16] [--depth 4] [--warps 8] [--nt 1]
                                                         [--mt 1] [--kw 1] [--gated] [--cuobjdump PATH]

It also prints the variant's registers per thread and its local-memory (spill) instructions.

2026-12-01, CPU (no results file; the counts are in benchmarks/NOTES.md): the NVFP4 bf16 main loop at 137.2
instructions per step of 64 weights (212 before the scale, layout and loop changes), 78 registers at NT 1.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import tempfile

from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.cuda.weight_mma_defines import source_defines


def window_counts(sass: str, mmas_per_step: int) -> tuple[int, collections.Counter]:
    ins = [line.split("*/", 1)[1].strip().rstrip(";").strip() for line in sass.splitlines()
           if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    mma = [i for i, line in enumerate(ins) if "HMMA" in line]
    if len(mma) < 3 * mmas_per_step:
        raise SystemExit(f"expected at least {3 * mmas_per_step} mmas, found {len(mma)}")
    step = ins[mma[mmas_per_step]:mma[2 * mmas_per_step]]  # the second unrolled step
    bars = [i for i, line in enumerate(step) if "BAR.SYNC" in line]
    if len(bars) >= 2:
        step = step[:bars[0]] + step[bars[-1] + 1:]
    return len(step), _ops(step)


def _ops(lines: list[str]) -> collections.Counter:
    return collections.Counter((x.split()[1] if x.startswith("@") else x.split()[0]).split(".")[0] for x in lines)


def loop_counts(sass: str, mmas_per_step: int, depth: int) -> tuple[float | None, collections.Counter]:
    """Instructions of the main loop (the backward branch whose body holds ``depth`` steps of mmas, the kernel's
    loop over whole passes of its ring) per step, leaving out the activation-staging block between its two
    ``BAR.SYNC``s."""
    lines = [(int(m.group(1), 16), m.group(2).split(";")[0].strip())
             for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*/\*", sass)]
    addr = [a for a, _ in lines]
    ins = [i for _, i in lines]
    loops = []
    for j, line in enumerate(ins):
        branch = re.search(r"BRA (?:`?\(?\.L_x_\d+\)?|0x([0-9a-f]+))", line)
        if branch and branch.group(1) and int(branch.group(1), 16) < addr[j]:
            first = addr.index(int(branch.group(1), 16))
            body = ins[first:j + 1]
            if sum("HMMA" in x for x in body) == mmas_per_step * depth:
                loops.append(body)
    if not loops:
        return None, collections.Counter()
    body = min(loops, key=len)
    bars = [i for i, x in enumerate(body) if "BAR.SYNC" in x]
    if len(bars) >= 2:
        body = body[:bars[0]] + body[bars[-1] + 1:]
    return len(body) / depth, _ops(body)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--fp16", action="store_true", help="fp16 activations (default bf16)")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--nt", type=int, default=1, help="n8 tiles of activation rows (1: M <= 8, 2: <= 16, 4: <= 32)")
    ap.add_argument("--mt", type=int, default=1, help="m16 tiles of weight rows per warp")
    ap.add_argument("--kw", type=int, default=1, help="warps along K per row tile")
    ap.add_argument("--gated", action="store_true")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    args = ap.parse_args()
    if not args.cuobjdump:
        raise SystemExit("cuobjdump not found: pass --cuobjdump (see the docstring)")
    defines = dict(source_defines("fp8" if args.fp8 else "nvfp4", "fp16" if args.fp16 else "bf16"),
                   **weight_mma.arch_defines(90), EARLY=1, SPLIT=1, OUT_F32=0, FP8=int(args.fp8), NT=args.nt, MT=args.mt, WARPS=args.warps,
                   KW=args.kw, DEPTH=args.depth, BF16=int(not args.fp16), GATED=int(args.gated), HAS_BIAS=0, VEC_X=1)
    cubin = nvrtc.compile_cubin(weight_mma.source_text(), weight_mma.KERNEL, 90, defines)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([args.cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([args.cuobjdump, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    spills = len(re.findall(r"\b(?:LDL|STL)\b", sass))
    print(f"registers per thread: {regs.group(1) if regs else '?'}; local-memory (spill) instructions: {spills}")
    per_step = (4 if args.fp8 else 8) * args.nt * args.mt * (2 if args.gated else 1)
    weights = (32 if args.fp8 else 64) * args.mt * (2 if args.gated else 1)
    n, ops = loop_counts(sass, per_step, args.depth)
    w, wops = window_counts(sass, per_step)
    if n is not None:
        print(f"loop: {n:.1f} instructions per step ({n / weights:.2f} per weight); per pass of {args.depth} steps: "
              + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    else:
        print("loop: no loop over whole passes of the ring in this kernel")
    print(f"window: {w} ({w / weights:.2f} per weight): " + ", ".join(f"{k} {v}" for k, v in wops.most_common()))


if __name__ == "__main__":
    main()
