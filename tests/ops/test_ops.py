"""The op boundary: torch.ops.anyfp4.* on CPU (reference) and CUDA (kernels, M dispatch inside)."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4, quantize_nvfp4
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def random_weight(n, k, seed, device="cpu", gs=None):
    g = torch.Generator().manual_seed(seed)
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g).to(device),
                       torch.randint(0, 0x7E, (n, k // 16), dtype=torch.uint8, generator=g).view(
                           torch.float8_e4m3fn).to(device),
                       (torch.tensor(3e-3) if gs is None else gs).to(device))


def args(p, bias=None):
    return (p.codes, p.scales, p.global_scale, bias, p.out_features, p.in_features)


def reference(x, w, bias=None):
    """x @ W^T (+ bias) in float32, each row of x its own product, as the ops' reference computes it (a matmul
    over M rows sums in an order that depends on M)."""
    dense = dequantize_nvfp4(w)
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.cat([x2[i:i + 1].float() @ dense.t() for i in range(x2.shape[0])]).reshape(*x.shape[:-1], -1)
    return y + bias.float() if bias is not None else y


def test_cpu_op_is_the_reference(monkeypatch):
    """With ``ANYFP4_CPU_KERNELS=reference`` the CPU op is the reference bit for bit (the C kernels are checked
    against it in tests/kernels/cpu/test_cpu_linear.py)."""
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "reference")
    w = random_weight(48, 64, 0)
    p = prepack_nvfp4(w)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    bias = torch.randn(48, dtype=torch.bfloat16)
    y = torch.ops.anyfp4.nvfp4_linear(x, *args(p, bias))
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    assert torch.equal(y, reference(x, w, bias).to(torch.bfloat16))


def test_opcheck_cpu():
    w = random_weight(48, 64, 1)
    p = prepack_nvfp4(w)
    x = torch.randn(5, 64, dtype=torch.float16)
    torch.library.opcheck(torch.ops.anyfp4.nvfp4_linear, (x, *args(p, torch.randn(48, dtype=torch.float16))))
    gate, up = random_weight(32, 64, 2), random_weight(32, 64, 3)
    pg = prepack_nvfp4_gated(gate, up)
    torch.library.opcheck(torch.ops.anyfp4.nvfp4_gated,
                          (x, pg.codes, pg.scales, pg.global_scale, pg.up_offset, pg.out_features, pg.in_features))


def test_compile_fullgraph_dynamic_cpu():
    w = random_weight(48, 64, 4)
    p = prepack_nvfp4(w)

    def f(x):
        return torch.ops.anyfp4.nvfp4_linear(x, *args(p)) * 2

    cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for m in (1, 512):
        x = torch.randn(m, 64, dtype=torch.bfloat16)
        assert torch.equal(cf(x), f(x))


@pytest.mark.parametrize("bad, message", [
    (lambda x, a: (x.float().to(torch.float64), *a), "float16 or bfloat16"),
    (lambda x, a: (x[:, :32], *a), "x has 32 features, the weight expects 64"),
    (lambda x, a: (x, a[0].view(torch.uint8), *a[1:]), "2-D int32 prepack"),
    (lambda x, a: (x, a[0], a[1][:, :1], *a[2:]), "do not match codes"),
    (lambda x, a: (x, *a[:2], a[2].double(), *a[3:]), "one float32 value"),
    (lambda x, a: (x, *a[:3], torch.zeros(3, dtype=x.dtype), *a[4:]), "bias must have shape \\(48,\\)"),
    (lambda x, a: (x, *a[:3], torch.zeros(48), *a[4:]), "bias must be torch.float16 on cpu like x"),
])
def test_bad_arguments_are_clear(bad, message):
    p = prepack_nvfp4(random_weight(48, 64, 5))
    x = torch.randn(2, 64, dtype=torch.float16)
    with pytest.raises((ValueError, TypeError), match=message):
        torch.ops.anyfp4.nvfp4_linear(*bad(x, args(p)))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("call, message", [
    (lambda op, x, c, s, *g: op.linear(x, c, s, *g, -1, 64), "must be positive, got -1, 64"),
    (lambda op, x, c, s, *g: op.linear(x, c, s, *g, 200, 64), r"codes \(128, \d+\) are not a prepack of out_features = 200|prepack covering 200 x 64"),
    (lambda op, x, c, s, *g: op.linear(x, c, s, *g, 48, 320), "not a prepack of in_features = 320|x has 64 features"),
    (lambda op, x, c, s, *g: op.gated(x, c, s, *g, 1, 48, 64), "up_offset must be 128 for out_features = 48"),
    (lambda op, x, c, s, *g: op.linear(x, c.to("meta"), s.to("meta"), *g, 48, 64), "must be on one device"),
])
def test_prepack_geometry_and_devices_are_checked(fmt, call, message):
    """Arguments that disagree with the prepack (out_features past its rows, a wrong up_offset, weights on meta)
    are refused instead of returning padding columns, wrong rows or uninitialised memory."""
    from types import SimpleNamespace

    from anyfp4.formats.fp8 import quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated

    x = torch.randn(2, 64, dtype=torch.bfloat16)
    if fmt == "nvfp4":
        w = random_weight(48, 64, 30)
        p, pg = prepack_nvfp4(w), prepack_nvfp4_gated(w, w)
        ops = SimpleNamespace(linear=lambda x, c, s, n, k: torch.ops.anyfp4.nvfp4_linear(x, c, s, p.global_scale, None, n, k),
                              gated=lambda x, c, s, u, n, k: torch.ops.anyfp4.nvfp4_gated(x, pg.codes, pg.scales,
                                                                                           pg.global_scale, u, n, k))
    else:
        w = quantize_fp8(torch.randn(48, 64))
        p, pg = prepack_fp8(w), prepack_fp8_gated(w, w)
        ops = SimpleNamespace(linear=lambda x, c, s, n, k: torch.ops.anyfp4.fp8_linear(x, c, s, None, n, k),
                              gated=lambda x, c, s, u, n, k: torch.ops.anyfp4.fp8_gated(x, pg.codes, pg.scales, u, n, k))
    with pytest.raises(ValueError, match=message):
        call(ops, x, p.codes, p.scales)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_dispatch_decode_and_prefill(dtype):
    w = random_weight(4120, 1552, 6, "cuda")
    p = prepack_nvfp4(w)
    for m in (1, 8, 32, 33, 512):
        x = torch.randn(m, 1552, device="cuda", dtype=dtype)
        y = torch.ops.anyfp4.nvfp4_linear(x, *args(p))
        ref = reference(x, w)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3


@gpu
def test_compile_warm_at_1_then_prefill_at_512():
    w = random_weight(4096, 4096, 7, "cuda")
    p = prepack_nvfp4(w)
    cf = torch.compile(lambda x: torch.ops.anyfp4.nvfp4_linear(x, *args(p)), fullgraph=True, dynamic=True)
    for m in (1, 512):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        y = cf(x)
        ref = reference(x, w)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3


@gpu
def test_cuda_graph_capture_and_replay():
    w = random_weight(4096, 4096, 8, "cuda")
    p = prepack_nvfp4(w)
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.ops.anyfp4.nvfp4_linear(x, *args(p))  # warm up (compiles the kernel)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.anyfp4.nvfp4_linear(x, *args(p))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.ops.anyfp4.nvfp4_linear(x, *args(p)))
    assert not torch.equal(out, y)


@gpu
def test_act_pack_switch_read_inside_the_op(monkeypatch):
    monkeypatch.setenv("ANYFP4_KERNELS", "triton")  # the switch belongs to the Triton decode kernel
    w = random_weight(4096, 4096, 9, "cuda")
    p = prepack_nvfp4(w)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for mode in ("0", "1", "auto"):
        monkeypatch.setenv("ANYFP4_ACT_PACK", mode)
        outs[mode] = torch.ops.anyfp4.nvfp4_linear(x, *args(p))
    assert torch.equal(outs["0"], outs["1"]) and torch.equal(outs["0"], outs["auto"])
    monkeypatch.setenv("ANYFP4_ACT_PACK", "sometimes")
    with pytest.raises(ValueError, match="ANYFP4_ACT_PACK"):
        torch.ops.anyfp4.nvfp4_linear(x, *args(p))


def test_fp8_ops_cpu_reference_and_opcheck():
    from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated

    g = torch.Generator().manual_seed(10)
    w = quantize_fp8(torch.randn(48, 64, generator=g), per_channel=True)
    p = prepack_fp8(w)
    x = torch.randn(3, 64, generator=g, dtype=torch.float32).to(torch.bfloat16)
    bias = torch.randn(48, generator=g).to(torch.bfloat16)
    y = torch.ops.anyfp4.fp8_linear(x, p.codes, p.scales, bias, 48, 64)
    assert torch.equal(y, (x.float() @ dequantize_fp8(w).t() + bias.float()).to(torch.bfloat16))
    torch.library.opcheck(torch.ops.anyfp4.fp8_linear, (x, p.codes, p.scales, bias, 48, 64))
    up = quantize_fp8(torch.randn(48, 64, generator=g))
    pg = prepack_fp8_gated(w, up)
    torch.library.opcheck(torch.ops.anyfp4.fp8_gated, (x, pg.codes, pg.scales, pg.up_offset, 48, 64))
    with pytest.raises(ValueError, match="x has 32 features"):
        torch.ops.anyfp4.fp8_linear(x[:, :32], p.codes, p.scales, None, 48, 64)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_cuda_paths(dtype):
    from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8

    w = quantize_fp8(torch.randn(4120, 1552, device="cuda"))
    p = prepack_fp8(w)
    for m in (1, 8, 64):
        x = torch.randn(m, 1552, device="cuda", dtype=dtype)
        y = torch.ops.anyfp4.fp8_linear(x, p.codes, p.scales, None, 4120, 1552)
        ref = x.float() @ dequantize_fp8(w).t()
        assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3


def test_partial_ops_are_the_unrounded_reference_cpu(monkeypatch):
    """nvfp4_linear_partial / fp8_linear_partial: the float32 product before the global / row scale and before
    rounding to x's dtype (the reference path; the C kernels' partial sums: tests/kernels/cpu/test_cpu_linear.py)."""
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "reference")
    from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8

    w = random_weight(48, 64, 21)
    p = prepack_nvfp4(w)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y = torch.ops.anyfp4.nvfp4_linear_partial(x, p.codes, p.scales, p.global_scale, 48, 64)
    unit = NVFP4Weight(w.packed, w.block_scale, torch.tensor(1.0))
    assert y.dtype == torch.float32 and torch.equal(y, reference(x, unit))  # before the global scale
    torch.testing.assert_close(y * w.global_scale, reference(x, w))
    torch.library.opcheck(torch.ops.anyfp4.nvfp4_linear_partial, (x, p.codes, p.scales, p.global_scale, 48, 64))
    f = quantize_fp8(torch.randn(48, 64), per_channel=True)
    pf = prepack_fp8(f)
    yf = torch.ops.anyfp4.fp8_linear_partial(x, pf.codes, pf.scales, 48, 64)
    assert yf.dtype == torch.float32
    torch.testing.assert_close(yf * pf.scales[:48], x.float() @ dequantize_fp8(f).t())
    torch.library.opcheck(torch.ops.anyfp4.fp8_linear_partial, (x, pf.codes, pf.scales, 48, 64))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_partial_ops_cuda(dtype):
    """On a GPU: float32 out for decode and prefill sizes; at M <= 32 scaling and rounding it gives the plain
    op's bits."""
    from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8

    w = random_weight(4120, 1552, 22, "cuda")
    p = prepack_nvfp4(w)
    f = quantize_fp8(torch.randn(4120, 1552, device="cuda"))
    pf = prepack_fp8(f)
    for m in (1, 8, 32, 33, 512):
        x = torch.randn(m, 1552, device="cuda", dtype=dtype)
        y = torch.ops.anyfp4.nvfp4_linear_partial(x, p.codes, p.scales, p.global_scale, 4120, 1552)
        yf = torch.ops.anyfp4.fp8_linear_partial(x, pf.codes, pf.scales, 4120, 1552)
        assert y.dtype == yf.dtype == torch.float32
        y, yf = y * p.global_scale, yf * pf.scales[:4120]  # the shares are sums before the scales
        for got, ref in ((y, reference(x, w)), (yf, x.float() @ dequantize_fp8(f).t())):
            assert ((got - ref).norm() / ref.norm()).item() < 8e-3, m
        if m <= 32:
            assert torch.equal(y.to(dtype), torch.ops.anyfp4.nvfp4_linear(x, *args(p)))
            assert torch.equal(yf.to(dtype), torch.ops.anyfp4.fp8_linear(x, pf.codes, pf.scales, None, 4120, 1552))


def test_split_k_argument_and_prefill_switch_cpu(monkeypatch):
    """The optional split_k argument passes opcheck (the CPU reference ignores it: no slices there); a bad
    ANYFP4_PREFILL value is a clear error."""
    from anyfp4.env import prefill_mode

    w = random_weight(48, 64, 23)
    p = prepack_nvfp4(w)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.anyfp4.nvfp4_linear, (x, *args(p), 2))
    assert torch.equal(torch.ops.anyfp4.nvfp4_linear(x, *args(p), 2), torch.ops.anyfp4.nvfp4_linear(x, *args(p)))
    torch.library.opcheck(torch.ops.anyfp4.nvfp4_linear_partial, (x, p.codes, p.scales, p.global_scale, 48, 64, 2))
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    assert prefill_mode() == "chunked"
    monkeypatch.setenv("ANYFP4_PREFILL", "fast")
    with pytest.raises(ValueError, match="ANYFP4_PREFILL"):
        prefill_mode()


@gpu
def test_fused_prefill_switch_read_inside_the_op(monkeypatch):
    """ANYFP4_PREFILL=fused: prefill-sized calls of the plain, gated and partial ops take the fused GEMM and
    still match the reference; decode-sized calls are unchanged."""
    w, gate, up = (random_weight(1024, 1536, s, "cuda") for s in (21, 22, 23))
    p, pg = prepack_nvfp4(w), prepack_nvfp4_gated(gate, up)
    x = torch.randn(96, 1536, device="cuda", dtype=torch.bfloat16)
    default = torch.ops.anyfp4.nvfp4_linear(x, *args(p))
    small = torch.ops.anyfp4.nvfp4_linear(x[:8], *args(p))
    monkeypatch.setenv("ANYFP4_PREFILL", "fused")
    y = torch.ops.anyfp4.nvfp4_linear(x, *args(p))
    assert not torch.equal(y, default)  # another kernel ran
    assert torch.equal(torch.ops.anyfp4.nvfp4_linear(x[:8], *args(p)), small)
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    assert rel(y, reference(x, w)) < 8e-3
    yg = torch.ops.anyfp4.nvfp4_gated(x, pg.codes, pg.scales, pg.global_scale, pg.up_offset, 1024, 1536)
    gref = torch.nn.functional.silu(reference(x, gate)) * reference(x, up)
    assert rel(yg, gref) < 2e-2
    share = torch.ops.anyfp4.nvfp4_linear_partial(x, p.codes, p.scales, p.global_scale, 1024, 1536)
    assert share.dtype == torch.float32 and rel(share * p.global_scale, reference(x, w)) < 1e-5


def test_ops_refuse_a_call_autograd_would_record():
    """No backward formula: with grad enabled and an input requiring grad the op refuses by name (a silently
    missing gradient otherwise); under no_grad it runs."""
    gen = torch.Generator().manual_seed(2)
    p = prepack_nvfp4(quantize_nvfp4(torch.randn(16, 64, generator=gen)))
    x = torch.randn(2, 64, generator=gen, requires_grad=True)
    with pytest.raises(RuntimeError, match="anyfp4::nvfp4_linear has no backward"):
        torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, 16, 64)
    with torch.no_grad():
        assert torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, 16, 64).shape == (2, 16)
