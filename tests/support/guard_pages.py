"""Run the CUDA decode kernel's grouped expert launch on the host build (host_cuda) with every input tensor placed
against a PROT_NONE page — its end against the page after it, or its start against the page before it — so that a
read past any tensor kills the process (SIGSEGV) instead of reading a neighbour's bytes. Linux.

    python guard_pages.py FMT N K GATED(0/1) end|start EXPERTS ROWS PAIRS_PER_ROW [BAD_ID]

prints "ok" when the launch ran. ``BAD_ID``: route every pair to that expert (a test that the guard catches)."""

import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import host_cuda  # noqa: E402
from anyfp4.dispatch.tuning import experts_mma_config  # noqa: E402
from anyfp4.kernels.cuda import weight_mma  # noqa: E402
from anyfp4.packing.layout import K_ALIGN, round_up  # noqa: E402

PAGE, PROT_NONE, PROT_RW, MAP_PRIVATE_ANON = 4096, 0, 3, 0x22
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_kept = []


def guarded(t: torch.Tensor, at_end: bool) -> torch.Tensor:
    """A copy of contiguous ``t`` ending 16-byte aligned right before a PROT_NONE page, or starting right after one."""
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // PAGE) + 2
    base = _libc.mmap(None, pages * PAGE, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
    guard = base + (pages - 1) * PAGE if at_end else base
    if _libc.mprotect(guard, PAGE, PROT_NONE):
        raise OSError(ctypes.get_errno(), "mprotect")
    start = (guard - nbytes) // 16 * 16 if at_end else base + PAGE
    buf = (ctypes.c_char * nbytes).from_address(start)
    _kept.append(buf)
    g = torch.frombuffer(buf, dtype=t.dtype, count=t.numel()).view(t.shape)
    g.copy_(t)
    return g


def main() -> None:
    fmt, n, k, gated, where, experts, rows, per_row = sys.argv[1:9]
    n, k, experts, rows, per_row, at_end = int(n), int(k), int(experts), int(rows), int(per_row), where == "end"
    from test_grouped_experts import stacked  # the GPU and host tests' random stacked prepacks

    gen = torch.Generator().manual_seed(1)
    packs, stacks = stacked(fmt, experts, n, k, gated == "1", gen)
    codes, block_scales, gscale = (guarded(t.contiguous(), at_end) if t is not None else None for t in stacks)
    x = guarded(torch.randn(rows, k, generator=gen).bfloat16(), at_end)
    ids = torch.randint(0, experts, (rows * per_row,), generator=gen, dtype=torch.int32)
    if len(sys.argv) > 9:
        ids.fill_(int(sys.argv[9]))
    ids = guarded(ids, at_end)
    out = guarded(torch.zeros(rows * per_row, n, dtype=torch.bfloat16), at_end)
    plan = weight_mma.plan_experts_launch(fmt, x, ids, codes, block_scales, gscale, n, packs[0].up_offset,
                                          experts_mma_config(round_up(k, K_ALIGN), fmt), out,
                                          stage_bytes=weight_mma.STAGE_BYTES)
    host_cuda.run(plan)
    print("ok")


if __name__ == "__main__":
    main()
