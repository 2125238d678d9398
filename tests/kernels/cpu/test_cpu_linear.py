"""The CPU kernels (kernels/cpu/linear.py, cpu/weight_cpu.c) against the pure-torch reference."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.formats.fp8 import FP8Weight, dequantize_fp8
from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4
from anyfp4.kernels.cpu import linear as cpu_linear
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

pytestmark = pytest.mark.skipif(cpu_linear.library() is None, reason="no C compiler builds the CPU kernels")


def random_nvfp4(n, k, gen, gs=3e-3):
    scales = torch.randint(0, 0x7F, (n, k // 16), dtype=torch.uint8, generator=gen)  # every finite scale, subnormals
    scales[0, 0] = 0  # a zero-scale block
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen),
                       scales.view(torch.float8_e4m3fn), torch.tensor(gs))


def random_fp8(n, k, gen):
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN
    return FP8Weight(codes.view(torch.float8_e4m3fn), torch.rand(n, generator=gen) + 0.01)


def close(y, ref, tol=2e-6):
    assert not torch.isnan(y).any()
    err = ((y.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < tol, err


SHAPES = [(48, 64), (130, 1552), (4120, 272), (16, 16)]


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 13, 33])
def test_nvfp4_matches_reference(n, k, m):
    gen = torch.Generator().manual_seed(n * 1000 + k + m)
    w = random_nvfp4(n, k, gen)
    x = torch.randn(m, k, generator=gen)
    y = cpu_linear.nvfp4_rows(cpu_linear.library(), x, prepack_nvfp4(w), (0,), float(w.global_scale))
    assert y.shape == (m, n)
    close(y, x.double() @ dequantize_nvfp4(w).double().t())


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_fp8_matches_reference(n, k, m):
    gen = torch.Generator().manual_seed(n * 1000 + k + m + 7)
    w = random_fp8(n, k, gen)
    x = torch.randn(m, k, generator=gen)
    y = cpu_linear.fp8_rows(cpu_linear.library(), x, prepack_fp8(w), (0,), True)
    close(y, x.double() @ dequantize_fp8(w).double().t())


def test_every_code_and_scale_decodes():
    """All 16 E2M1 codes under every E4M3 scale byte, and every E4M3 weight byte (subnormals, -0), one at a
    time: each output is one weight times x = 1."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(127)  # code c in column c of block b
    scale_bytes = torch.arange(127, dtype=torch.uint8)
    n = 127 * 16
    packed = torch.zeros(n, 8, dtype=torch.uint8)  # row r: its code at k = 0
    packed[:, 0] = codes
    block = torch.zeros(n, 1, dtype=torch.uint8)
    block[:, 0] = scale_bytes.repeat_interleave(16)
    w = NVFP4Weight(packed, block.view(torch.float8_e4m3fn), torch.tensor(1.0))
    x = torch.zeros(1, 16)
    x[0, 0] = 1.0
    y = cpu_linear.nvfp4_rows(cpu_linear.library(), x, prepack_nvfp4(w), (0,), 1.0)
    assert torch.equal(y[0], dequantize_nvfp4(w)[:, 0])
    values = torch.arange(256, dtype=torch.uint8)
    values = values[(values & 0x7F) != 0x7F]
    f = FP8Weight(torch.zeros(len(values), 4, dtype=torch.uint8).index_fill_(1, torch.tensor([0]), 0)
                  .view(torch.float8_e4m3fn), torch.ones(len(values)))
    f.weight.view(torch.uint8)[:, 0] = values
    xf = torch.zeros(1, 4)
    xf[0, 0] = 1.0
    yf = cpu_linear.fp8_rows(cpu_linear.library(), xf, prepack_fp8(f), (0,), True)
    assert torch.equal(yf[0], dequantize_fp8(f)[:, 0])


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_rows_do_not_depend_on_the_call(fmt, monkeypatch):
    """A row of x gives the same bits alone, inside any batch, and with one thread or several."""
    gen = torch.Generator().manual_seed(3)
    n, k = 1030, 1552
    if fmt == "nvfp4":
        w = random_nvfp4(n, k, gen)
        p, run = prepack_nvfp4(w), lambda x: cpu_linear.nvfp4_rows(cpu_linear.library(), x, p, (0,), 0.5)
    else:
        w = random_fp8(n, k, gen)
        p, run = prepack_fp8(w), lambda x: cpu_linear.fp8_rows(cpu_linear.library(), x, p, (0,), True)
    x = torch.randn(64, k, generator=gen)
    monkeypatch.setattr(cpu_linear, "MIN_THREAD_WORK", 1 << 12)  # every call split between four threads
    monkeypatch.setattr(cpu_linear, "threads", lambda: 4)
    alone = torch.cat([run(x[i:i + 1]) for i in range(64)])
    for m in (2, 7, 8, 9, 33, 64):
        assert torch.equal(run(x[:m]), alone[:m]), m
    monkeypatch.setattr(cpu_linear, "threads", lambda: 1)
    assert torch.equal(run(x), alone)


def test_ops_gated_bias_partial_and_poisoned_output(monkeypatch):
    """Through the ops: bias, gated silu(gate) * up, partial sums; the kernel writes every output (the output
    buffer starts as NaN)."""
    real_empty = torch.empty
    monkeypatch.setattr(cpu_linear.torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(5)
    n, k = 200, 272
    gate, up = random_nvfp4(n, k, gen, gs=2e-3), random_nvfp4(n, k, gen, gs=2e-3)
    x = torch.randn(3, k, generator=gen)
    pg = prepack_nvfp4_gated(gate, up)
    y = torch.ops.anyfp4.nvfp4_gated(x, pg.codes, pg.scales, pg.global_scale, pg.up_offset, n, k)
    g_ref, u_ref = (x.double() @ dequantize_nvfp4(q).double().t() for q in (gate, up))
    close(y, torch.nn.functional.silu(g_ref) * u_ref, 1e-5)
    bias = torch.randn(n, generator=gen)
    p = prepack_nvfp4(gate)
    yb = torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, bias, n, k)
    close(yb, g_ref + bias.double())
    part = torch.ops.anyfp4.nvfp4_linear_partial(x, p.codes, p.scales, p.global_scale, n, k)
    close(part * 2e-3, g_ref)
    fg, fu = random_fp8(n, k, gen), random_fp8(n, k, gen)
    pf = prepack_fp8_gated(fg, fu)
    yf = torch.ops.anyfp4.fp8_gated(x, pf.codes, pf.scales, pf.up_offset, n, k)
    fg_ref, fu_ref = (x.double() @ dequantize_fp8(q).double().t() for q in (fg, fu))
    close(yf, torch.nn.functional.silu(fg_ref) * fu_ref, 1e-5)
    pfl = prepack_fp8(fg)
    close(torch.ops.anyfp4.fp8_linear(x, pfl.codes, pfl.scales, bias, n, k), fg_ref + bias.double())
    close(torch.ops.anyfp4.fp8_linear_partial(x, pfl.codes, pfl.scales, n, k) * pfl.scales[:n], fg_ref)


def test_reference_mode_and_missing_compiler(monkeypatch):
    """``ANYFP4_CPU_KERNELS=reference`` runs the pure-torch reference; without a compiler ``auto`` falls back
    to it with one warning and ``c`` is an error."""
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "reference")
    assert cpu_linear.library() is None
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "auto")
    monkeypatch.setattr(cpu_linear, "_load", lambda: OSError("no C compiler found (install gcc or set CC)"))
    cpu_linear._warn_unavailable.cache_clear()
    with pytest.warns(UserWarning, match="no C compiler found"):
        assert cpu_linear.library() is None
    monkeypatch.setenv("ANYFP4_CPU_KERNELS", "c")
    with pytest.raises(OSError, match="no C compiler found"):
        cpu_linear.library()


def test_build_failure_names_the_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_linear, "SOURCE", tmp_path / "broken.c")
    (tmp_path / "broken.c").write_text("this is not C;\n")
    with pytest.raises(OSError, match="could not compile broken.c"):
        cpu_linear._build(cpu_linear._compiler(), tmp_path / "out")
    assert not any((tmp_path / "out").iterdir())  # no half-written library left behind


def test_portable_path_matches_reference(tmp_path):
    """The plain-C path (machines without AVX-512) computes the same function."""
    lib = cpu_linear.open_library(cpu_linear._build(cpu_linear._compiler(), tmp_path, ("-DWEIGHT_CPU_PORTABLE",)))
    gen = torch.Generator().manual_seed(11)
    w, f = random_nvfp4(130, 1552, gen), random_fp8(130, 1552, gen)
    x = torch.randn(9, 1552, generator=gen)
    close(cpu_linear.nvfp4_rows(lib, x, prepack_nvfp4(w), (0,), 3e-3), x.double() @ dequantize_nvfp4(w).double().t())
    close(cpu_linear.fp8_rows(lib, x, prepack_fp8(f), (0,), True), x.double() @ dequantize_fp8(f).double().t())
    assert cpu_linear.features(lib) == {"avx512": False, "bf16_dot_products": False, "amx_tiles": False}
    for half in (x.bfloat16(), x.half()):  # widened in C
        close(cpu_linear.nvfp4_rows(lib, half, prepack_nvfp4(w), (0,), 3e-3),
              half.double() @ dequantize_nvfp4(w).double().t())
        close(cpu_linear.fp8_rows(lib, half, prepack_fp8(f), (0,), True),
              half.double() @ dequantize_fp8(f).double().t())


def test_prepacks_refuse_nan_alike():
    """Like prepack_nvfp4 with a NaN block scale, prepack_fp8 refuses NaN weight bytes and bad scales."""
    codes = torch.full((4, 16), 0x38, dtype=torch.uint8)
    codes[2, 5] = 0xFF
    with pytest.raises(ValueError, match=r"1 FP8 weight value\(s\) are NaN \(first: row 2, column 5\)"):
        prepack_fp8(FP8Weight(codes.view(torch.float8_e4m3fn), torch.tensor(1.0)))
    with pytest.raises(ValueError, match="scales must be finite and positive"):
        prepack_fp8(FP8Weight(torch.full((4, 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn),
                              torch.tensor(float("inf"))))
    scales = torch.full((4, 1), 0x38, dtype=torch.uint8)
    scales[1, 0] = 0x7F
    with pytest.raises(ValueError, match="negative or NaN"):
        prepack_nvfp4(NVFP4Weight(torch.zeros(4, 8, dtype=torch.uint8), scales.view(torch.float8_e4m3fn),
                                  torch.tensor(1.0)))


def test_non_contiguous_prepacks_read_right():
    """The kernels read dense row-major words: a strided view of the same prepack gives the same bits."""
    gen = torch.Generator().manual_seed(13)
    w = random_nvfp4(128, 256, gen)
    p = prepack_nvfp4(w)
    strided = type(p)(p.codes.t().contiguous().t(), p.scales.t().contiguous().t(), p.global_scale,
                      p.out_features, p.in_features)
    assert not strided.codes.is_contiguous()
    x = torch.randn(3, 256, generator=gen)
    lib = cpu_linear.library()
    assert torch.equal(cpu_linear.nvfp4_rows(lib, x, strided, (0,), 1.0), cpu_linear.nvfp4_rows(lib, x, p, (0,), 1.0))


def bf16_dot_products() -> bool:
    return cpu_linear.features(cpu_linear.library())["bf16_dot_products"]


# bf16 rows take AMX tiles where the CPU has them, else the bf16 dot products: both builds are tested here
BF16_BUILDS = ["native", "no_amx"]


@pytest.fixture(scope="module")
def bf16_libraries(tmp_path_factory):
    no_amx = cpu_linear._build(cpu_linear._compiler(), tmp_path_factory.mktemp("no_amx"), ("-DWEIGHT_CPU_NO_AMX",))
    return {"native": cpu_linear.library(), "no_amx": cpu_linear.open_library(no_amx)}


def test_amx_tiles_where_the_cpu_has_them(bf16_libraries):
    """The native build takes AMX tiles for bf16 rows on a CPU that lists them (Linux grants them from 5.16), and
    the build without them does not."""
    flags = cpu_linear._cpu_signature().split()
    has_amx = {"amx_tile", "amx_bf16"} <= set(flags)
    assert cpu_linear.features(bf16_libraries["native"])["amx_tiles"] == has_amx
    assert not cpu_linear.features(bf16_libraries["no_amx"])["amx_tiles"]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations_and_strided_rows(fmt, dtype):
    """The C code widens bf16 / fp16 rows itself (fp16 subnormals, signed zeros and the largest values included)
    and reads rows at any row stride: a strided view gives the bits of the same rows made dense, and these equal
    those of the same values as float32 rows — except bf16 rows on CPUs with bf16 dot products, which sum in
    another order (then close to them)."""
    gen = torch.Generator().manual_seed(21)
    k = 272  # not a whole number of tiles: the prepack's padding past K is skipped
    if fmt == "nvfp4":
        w = random_nvfp4(40, k, gen)
        p, rows = prepack_nvfp4(w), cpu_linear.nvfp4_rows
        run = lambda x: rows(cpu_linear.library(), x, p, (0,), 0.25)  # noqa: E731
    else:
        p, rows = prepack_fp8(random_fp8(40, k, gen)), cpu_linear.fp8_rows
        run = lambda x: rows(cpu_linear.library(), x, p, (0,), True)  # noqa: E731
    wide = torch.randn(5, 2 * k, generator=gen).to(dtype)
    wide[0, :8] = torch.tensor([0.0, -0.0, 6e-8, -6e-8, 3e-5, -1e-6, 60000.0, -60000.0]).to(dtype)
    for x in (wide[:, ::2], wide[:, :k]):  # row stride 2k, column stride 2 / 1 (read in place)
        y = run(x)
        assert torch.equal(y, run(x.contiguous()))
        if dtype == torch.bfloat16 and bf16_dot_products():
            close(y, run(x.float()))
        else:
            assert torch.equal(y, run(x.float().contiguous()))


@pytest.mark.parametrize("build", BF16_BUILDS)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 13, 17, 70])
def test_bf16_rows_match_reference(bf16_libraries, build, fmt, n, k, m):
    """bf16 rows (AMX tiles or the bf16 dot products where the CPU has them; 17 and 70 rows: a part-filled group
    of 16 rows, more than one pass of 64): the reference's sums."""
    lib = bf16_libraries[build]
    gen = torch.Generator().manual_seed(n * 1000 + k + m + 3)
    x = torch.randn(m, k, generator=gen).bfloat16()
    if fmt == "nvfp4":
        w = random_nvfp4(n, k, gen)
        y = cpu_linear.nvfp4_rows(lib, x, prepack_nvfp4(w), (0,), float(w.global_scale))
        ref = x.double() @ dequantize_nvfp4(w).double().t()
    else:
        f = random_fp8(n, k, gen)
        y = cpu_linear.fp8_rows(lib, x, prepack_fp8(f), (0,), True)
        ref = x.double() @ dequantize_fp8(f).double().t()
    assert y.shape == (m, n)
    close(y, ref)


@pytest.mark.parametrize("build", BF16_BUILDS)
def test_every_code_decodes_with_bf16_rows(bf16_libraries, build):
    """Each of the 16 E2M1 codes in each of the 8 places of a word (each pair's first and second code) under a
    few block scales, one weight times x = 1 at a time, through bf16 rows."""
    n = 16 * 8
    codes = torch.arange(16, dtype=torch.uint8).repeat(8)  # row r: code r % 16 at k = r // 16
    packed = torch.zeros(n, 8, dtype=torch.uint8)
    ks = torch.arange(n) // 16
    packed[torch.arange(n), ks // 2] = torch.where(ks % 2 == 0, codes, codes << 4)
    scale = torch.tensor([0x38, 0x01, 0x7E, 0x40], dtype=torch.uint8)[torch.arange(n) % 4]  # 1, 2^-9, 448, 2
    w = NVFP4Weight(packed, scale[:, None].view(torch.float8_e4m3fn), torch.tensor(1.0))
    lib = bf16_libraries[build]
    for k in range(8):
        x = torch.zeros(1, 16, dtype=torch.bfloat16)
        x[0, k] = 1.0
        y = cpu_linear.nvfp4_rows(lib, x, prepack_nvfp4(w), (0,), 1.0)
        assert torch.equal(y[0], dequantize_nvfp4(w)[:, k]), k


@pytest.mark.parametrize("build", BF16_BUILDS)
def test_every_fp8_byte_decodes_with_bf16_rows(bf16_libraries, build):
    """Every finite E4M3 byte (subnormals, both zeros) in each of the 4 places of a word (each pair's first and
    second value), one weight times x = 1 at a time, through bf16 rows."""
    values = torch.arange(256, dtype=torch.uint8)
    values = values[(values & 0x7F) != 0x7F]
    lib = bf16_libraries[build]
    for k in range(4):
        codes = torch.zeros(len(values), 4, dtype=torch.uint8)
        codes[:, k] = values
        f = FP8Weight(codes.view(torch.float8_e4m3fn), torch.ones(len(values)))
        x = torch.zeros(1, 4, dtype=torch.bfloat16)
        x[0, k] = 1.0
        y = cpu_linear.fp8_rows(lib, x, prepack_fp8(f), (0,), True)
        assert torch.equal(y[0], dequantize_fp8(f)[:, k]), k


@pytest.mark.parametrize("build", BF16_BUILDS)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_bf16_rows_do_not_depend_on_the_call(bf16_libraries, build, fmt, monkeypatch):
    """bf16 rows give the same bits alone, inside any batch (AMX: part-filled groups of 16 rows, more than one
    pass of 64) and with one thread or several."""
    lib = bf16_libraries[build]
    gen = torch.Generator().manual_seed(5)
    if fmt == "nvfp4":
        p = prepack_nvfp4(random_nvfp4(1030, 1552, gen))
        run = lambda x: cpu_linear.nvfp4_rows(lib, x, p, (0,), 0.5)  # noqa: E731
    else:
        p = prepack_fp8(random_fp8(1030, 1552, gen))
        run = lambda x: cpu_linear.fp8_rows(lib, x, p, (0,), True)  # noqa: E731
    x = torch.randn(70, 1552, generator=gen).bfloat16()
    monkeypatch.setattr(cpu_linear, "MIN_THREAD_WORK", 1 << 12)
    monkeypatch.setattr(cpu_linear, "threads", lambda: 3)
    alone = torch.cat([run(x[i:i + 1]) for i in range(70)])
    for m in (2, 6, 8, 9, 16, 17, 33, 64, 65, 70):
        assert torch.equal(run(x[:m]), alone[:m]), m
    monkeypatch.setattr(cpu_linear, "threads", lambda: 1)
    assert torch.equal(run(x), alone)


@pytest.mark.parametrize("build", BF16_BUILDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_rows_give_an_empty_result(bf16_libraries, build, dtype):
    """A call with no rows of x (an empty batch) returns (0, N) without touching the tiles."""
    gen = torch.Generator().manual_seed(4)
    lib = bf16_libraries[build]
    x = torch.zeros(0, 272, dtype=dtype)
    assert cpu_linear.nvfp4_rows(lib, x, prepack_nvfp4(random_nvfp4(40, 272, gen)), (0,), 1.0).shape == (0, 40)
    assert cpu_linear.fp8_rows(lib, x, prepack_fp8(random_fp8(40, 272, gen)), (0,), True).shape == (0, 40)


@pytest.mark.parametrize("build", BF16_BUILDS)
def test_bf16_gated_bias_and_partial_through_the_ops(bf16_libraries, build, monkeypatch):
    """bf16 rows through the ops: the up half of a gated prepack (rows from its offset), bias, partial sums, odd
    N and K; every output written (the output buffer starts as NaN)."""
    from anyfp4.ops import linear_run

    monkeypatch.setattr(linear_run, "library", lambda: bf16_libraries[build])
    real_empty = torch.empty
    monkeypatch.setattr(cpu_linear.torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(17)
    n, k = 200, 272
    x = torch.randn(19, k, generator=gen).bfloat16()
    gate, up = random_nvfp4(n, k, gen, gs=2e-3), random_nvfp4(n, k, gen, gs=2e-3)
    pg = prepack_nvfp4_gated(gate, up)
    y = torch.ops.anyfp4.nvfp4_gated(x, pg.codes, pg.scales, pg.global_scale, pg.up_offset, n, k)
    g_ref, u_ref = (x.double() @ dequantize_nvfp4(q).double().t() for q in (gate, up))
    close(y.double(), torch.nn.functional.silu(g_ref) * u_ref, 4e-3)  # rounded to bf16
    p = prepack_nvfp4(gate)
    close(torch.ops.anyfp4.nvfp4_linear_partial(x, p.codes, p.scales, p.global_scale, n, k) * 2e-3, g_ref)
    fg, fu = random_fp8(n, k, gen), random_fp8(n, k, gen)
    pf = prepack_fp8_gated(fg, fu)
    yf = torch.ops.anyfp4.fp8_gated(x, pf.codes, pf.scales, pf.up_offset, n, k)
    fg_ref, fu_ref = (x.double() @ dequantize_fp8(q).double().t() for q in (fg, fu))
    close(yf.double(), torch.nn.functional.silu(fg_ref) * fu_ref, 4e-3)
    bias = torch.randn(n, generator=gen).bfloat16()
    pfl = prepack_fp8(fg)
    close(torch.ops.anyfp4.fp8_linear(x, pfl.codes, pfl.scales, bias, n, k).double(), fg_ref + bias.double(), 4e-3)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_dense_rows_match_reference_and_do_not_depend_on_the_call(tmp_path, monkeypatch, portable, wdtype):
    """Dense weights (an unquantized lm_head) through the C kernels, AVX-512 and plain C, k not a multiple of the
    lanes, x float32 / bf16 / strided: the float64 product to float32 rounding, and a row alone gives the bits it
    gives inside any batch and with one thread or several (torch's float32 GEMM does not: its row sums change
    order with the row count)."""
    lib = cpu_linear.open_library(cpu_linear._build(cpu_linear._compiler(), tmp_path, ("-DWEIGHT_CPU_PORTABLE",))) \
        if portable else cpu_linear.library()
    gen = torch.Generator().manual_seed(17)
    n, k = 1030, 1000 + 7
    w = torch.randn(n, k, generator=gen).to(wdtype)
    x = torch.randn(40, 2 * k, generator=gen)[:, ::2]  # strided along k: copied to unit stride for the C code
    ref = x.double() @ w.double().t()
    y = cpu_linear.dense_rows(lib, x, w)
    close(y, ref)
    close(cpu_linear.dense_rows(lib, x.bfloat16(), w), x.bfloat16().double() @ w.double().t())
    monkeypatch.setattr(cpu_linear, "MIN_THREAD_WORK", 1 << 12)
    monkeypatch.setattr(cpu_linear, "threads", lambda: 4)
    alone = torch.cat([cpu_linear.dense_rows(lib, x[i:i + 1], w) for i in range(40)])
    for m in (2, 3, 7, 8, 9, 33, 40):
        assert torch.equal(cpu_linear.dense_rows(lib, x[:m], w), alone[:m]), m
    assert torch.equal(y, alone)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_linear.dense_rows(lib, x, w.half())


def test_dense_linear_takes_the_c_rows_on_the_cpu():
    """``DenseLinear`` on the CPU: <= DECODE_ROWS rows by the C kernels (bias added, x's dtype out), more by torch."""
    from anyfp4.nn.linear import DenseLinear

    gen = torch.Generator().manual_seed(19)
    w, b = torch.randn(300, 96, generator=gen), torch.randn(300, generator=gen)
    lin = DenseLinear(w, b, "cpu", torch.float32)
    x = torch.randn(2, 5, 96, generator=gen)
    y = lin(x)
    assert y.shape == (2, 5, 300) and y.dtype == torch.float32
    assert torch.equal(y.reshape(10, 300), cpu_linear.dense_rows(cpu_linear.library(), x.reshape(10, 96), w) + b)
    big = torch.randn(40, 96, generator=gen)
    assert torch.equal(lin(big), torch.nn.functional.linear(big, w, b))
