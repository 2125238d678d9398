"""Batch invariance of the ops on the CPU: a row of x gives the same output bits alone and inside a call of 2..64
rows, at any position, for NVFP4 and FP8, plain (with and without bias), gated and partial, with either CPU kernel
choice (the C kernels, ``ANYFP4_CPU_KERNELS=c``, and the pure-torch reference). Greedy serving of several
requests in one batch (vLLM's, anyfp4's own) then gives every request the text it gets alone, as far as the
linears go. Output buffers start as NaN, so a row the path never wrote shows."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.formats.fp8 import quantize_fp8
from anyfp4.formats.nvfp4 import quantize_nvfp4, shared_global_scale
from anyfp4.kernels.cpu import linear as cpu_linear
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

K = 272  # 17 NVFP4 groups: not a whole number of prepack tiles
ROWS = 64
# batch sizes from 2 to ROWS: every size around the boundaries where a kernel's blocking or threading can change
BATCHES = (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 63, 64)
KINDS = ("plain", "bias", "gated", "partial")


def c_kernels(mode):
    if mode == "c" and cpu_linear.library() is None:
        pytest.skip("no C compiler builds the CPU kernels")


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty of a floating dtype comes back full of NaN (in the ops and in the C kernels' wrapper)."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def op_call(fmt, kind, n, gen, dtype=torch.float32):
    """``f(x)``: the op of ``kind`` on one random layer of n outputs (weights and scales from formats/; the bias
    in ``dtype``, x's)."""
    if fmt == "nvfp4":
        dense = [torch.randn(n, K, generator=gen) * 0.05 for _ in range(2)]
        w, up = (quantize_nvfp4(d, shared_global_scale(dense)) for d in dense)  # gate/up share one scale
        p = prepack_nvfp4_gated(w, up) if kind == "gated" else prepack_nvfp4(w)
        head = (p.codes, p.scales, p.global_scale)
        ops = {"plain": torch.ops.anyfp4.nvfp4_linear, "gated": torch.ops.anyfp4.nvfp4_gated,
               "partial": torch.ops.anyfp4.nvfp4_linear_partial}
    else:
        w, up = (quantize_fp8(torch.randn(n, K, generator=gen), per_channel=True) for _ in range(2))
        p = prepack_fp8_gated(w, up) if kind == "gated" else prepack_fp8(w)
        head = (p.codes, p.scales)
        ops = {"plain": torch.ops.anyfp4.fp8_linear, "gated": torch.ops.anyfp4.fp8_gated,
               "partial": torch.ops.anyfp4.fp8_linear_partial}
    bias = torch.randn(n, generator=gen).to(dtype)
    if kind == "gated":
        return lambda x: ops["gated"](x, *head, p.up_offset, n, K)
    if kind == "partial":
        return lambda x: ops["partial"](x, *head, n, K)
    return lambda x: ops["plain"](x, *head, bias if kind == "bias" else None, n, K)


def check_rows(f, x):
    alone = [f(x[i:i + 1].clone()) for i in range(ROWS)]
    assert not any(torch.isnan(a).any() for a in alone)
    for m in BATCHES:
        y = f(x[:m])
        bad = [i for i in range(m) if not torch.equal(y[i:i + 1], alone[i])]
        assert not bad, f"M = {m}: rows {bad[:8]} differ from the same rows alone"


@pytest.fixture
def two_threads():
    """torch (and so the C kernels' wrapper) on two threads, as on a two-core machine without OMP_NUM_THREADS."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)




@pytest.mark.parametrize("mode", ["c", "reference"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("n", [256, 1000])
def test_a_row_keeps_its_bits_in_any_batch(poisoned_empty, two_threads, monkeypatch, fmt, kind, mode, n):
    """n = 1000: not a whole number of tiles or vectors, and M * n crosses torch's parallel grain at M = 33 (the
    gated silu is taken row by row: over (M, N) torch would cut rows at M-dependent places)."""
    c_kernels(mode)
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", mode)
    gen = torch.Generator().manual_seed(1000 * n + 10 * KINDS.index(kind) + (fmt == "fp8"))
    f = op_call(fmt, kind, n, gen)
    check_rows(f, torch.randn(ROWS, K, generator=gen))


@pytest.mark.parametrize("mode", ["c", "reference"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_bfloat16_rows_and_three_dimensional_x(monkeypatch, fmt, mode):
    """As vLLM calls the plain op: bfloat16 activations, bias; x of shape (tokens, K) or (batch, seq, K)."""
    c_kernels(mode)
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", mode)
    gen = torch.Generator().manual_seed(7 + (fmt == "fp8"))
    f = op_call(fmt, "bias", 200, gen, torch.bfloat16)
    x = torch.randn(ROWS, K, generator=gen).to(torch.bfloat16)
    check_rows(f, x)
    assert torch.equal(f(x.view(8, 8, K)), f(x).view(8, 8, -1))


@pytest.mark.skipif(cpu_linear.library() is None, reason="no C compiler builds the CPU kernels")
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_c_rows_do_not_depend_on_the_threads_split(monkeypatch, fmt):
    """The C kernels split the output columns between threads (by work, so by M): 1 or 3 threads, any M, the
    same bits."""
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "c")
    gen = torch.Generator().manual_seed(21 + (fmt == "fp8"))
    f = op_call(fmt, "bias", 1030, gen)
    x = torch.randn(ROWS, K, generator=gen)
    alone = f(x[:1].clone())
    monkeypatch.setattr(cpu_linear, "threads", lambda: 3)
    monkeypatch.setattr(cpu_linear, "MIN_THREAD_WORK", 1 << 12)  # every call split, the first row alone too
    for m in (1, 5, 64):
        assert torch.equal(f(x[:m])[:1], alone), m
