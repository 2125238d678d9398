"""Which loads an early-launched CUDA decode kernel issues before ``griddepcontrol.wait``, on the CPU: every sm_90
M = 1 config of the launch table compiled with NVRTC (bf16, early launch), disassembled with ``cuobjdump`` (on PATH,
or the one Triton's NVIDIA backend ships), and the global loads (LDG) before the wait (SASS ``ACQBULK``) counted
against the ring's first fill (depth x code-word loads, NVFP4 a scale word too), with the kernel parameters read
before it. The design has the block fill its ring before the wait, so that the weights stream while the kernel
before finishes; ptxas, free to move read-only loads below an acquire, decides per config.

    PYTHONPATH=src python benchmarks/probes/ring_before_wait.py [--source weight_mma.cu] [--out ring.json]

``--source``: another version of the kernel's source (the same arguments), to compare.

2026-12-06, CPU (`benchmarks/NOTES.md`): at a65b75d, of the 20 distinct M = 1 configs 6 had their whole ring
before the wait (NVFP4 with K warps, two m16 tiles or gated) and 14 none — every FP8 one, NVFP4 at depth 4 and 8,
Llama-3.1-8B's down projection and the lm_head: an early launch prefetched nothing for them. The first fill as
volatile inline-asm loads gave 10 whole rings; with every loaded word also used before the wait (a volatile shared
store of their xor), all 20. Timed on an H100 that pinned fill made FP8 3% faster and NVFP4 6% slower, so the kernel
pins it for FP8 alone (`results/ring_before_wait_cpu.json`: the kernel since; `results/ring_before_wait_h100.json`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from anyfp4.dispatch.launch_tables import builtin_mma_table
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.cuda.weight_mma_defines import source_defines

# sm_90 kernel parameter offsets (c[0x0][...]): the eight pointers from 0x210, in weight_mma.cu's order
POINTERS = {0x210: "x", 0x218: "codes", 0x220: "scales", 0x228: "gscale", 0x230: "bias", 0x238: "out",
            0x240: "partial", 0x248: "counters"}


def disassembler(given: str | None) -> str:
    import triton

    shipped = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = given or shutil.which("cuobjdump") or (str(shipped) if shipped.exists() else None)
    if not found:
        raise SystemExit("no cuobjdump: pass --cuobjdump PATH")
    return found


def before_wait(source: str, defines: dict, tool: str) -> tuple[int, list[str]]:
    """(global loads before the wait, pointer parameters read before it) of one variant."""
    cubin = nvrtc.compile_cubin(source, weight_mma.KERNEL, 90, defines)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
    loads = sum("LDG" in line for line in lines[:wait])
    read = {POINTERS[int(m, 16)] for line in lines[:wait] for m in re.findall(r"c\[0x0\]\[(0x[0-9a-f]+)\]", line)
            if int(m, 16) in POINTERS}
    return loads, sorted(read)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, default=None)
    ap.add_argument("--cuobjdump", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not nvrtc.compiler_available():
        raise SystemExit("NVRTC not found (pip install nvidia-cuda-nvrtc)")
    tool = disassembler(args.cuobjdump)
    source = args.source.read_text() if args.source else weight_mma.source_text()
    rows, seen = [], set()
    for (sm, fmt, gated, k, n, m), c in sorted(builtin_mma_table().items(), key=str):
        sig = (fmt, gated, c.mt, c.warps, c.kw, c.depth, c.split_k > 1)
        if sm != 90 or m != 1 or sig in seen:
            continue
        seen.add(sig)
        defines = dict(source_defines(fmt, "bf16"), FP8=int(fmt == "fp8"), NT=1, MT=c.mt, WARPS=c.warps,
                       DEPTH=c.depth, BF16=1, GATED=int(gated), HAS_BIAS=0, OUT_F32=0, EARLY=1, VEC_X=1,
                       SPLIT=c.split_k, KW=c.kw, **weight_mma.arch_defines(90))
        loads, read = before_wait(source, defines, tool)
        ring = c.depth * (2 if fmt == "fp8" else 3) * c.mt * (2 if gated else 1)
        rows.append({"format": fmt, "gated": gated, "n": n, "k": k, "config": vars(c) if hasattr(c, "__dict__")
                     else str(c), "loads_before_wait": loads, "ring_fill": ring, "pointers_read_before_wait": read})
        print(f"{fmt:5s} {'gated ' if gated else ''}{n}x{k} {c}: {loads} of the ring's {ring} loads before the wait; "
              f"pointers read before it: {', '.join(read) or 'none'}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"source": str(args.source or "weight_mma.cu"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
