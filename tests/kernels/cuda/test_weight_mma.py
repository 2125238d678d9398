"""The CUDA tensor-core decode kernel (kernels/cuda/weight_mma.cu, NVRTC): its bit tricks emulated in torch on
the CPU, every variant compiled for sm_80..90 without a GPU (when NVRTC is installed), and on a GPU the
kernel against the reference for NVFP4 and FP8, fp16 and bf16, every M bucket, bias, gated, split-K."""

import itertools

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4, which the op-level tests call)
from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4
from anyfp4.kernels.cuda import nvrtc, weight_mma, weight_mma_geometry
from anyfp4.kernels.cuda.counters import reserve_counters
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated
from anyfp4.dispatch import tuning
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda.weight_mma import fp8_mma_gemm, nvfp4_mma_gemm
from anyfp4.kernels.cuda.weight_mma_defines import STAGING, XS_PAD, source_defines
from mma_checks import check_kernel, nvfp4_weight, rel_err, sweep_cases

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_nvrtc = pytest.mark.skipif(not nvrtc.compiler_available(),
                                 reason="NVRTC (nvidia-cuda-nvrtc) not installed")


def halves(bits: torch.Tensor, dtype) -> torch.Tensor:
    """int32 words -> the two 16-bit halves as ``dtype`` values, (..., 2) float64."""
    lo, hi = bits & 0xFFFF, (bits >> 16) & 0xFFFF
    pair = torch.stack([lo, hi], -1).to(torch.int16)
    return pair.view(dtype).double()


def kernel_constants():
    """The scale multipliers and epilogue units the kernel is compiled with (``source_defines``, which every launch
    passes to the source: ``test_launch_defines_are_the_layouts_and_the_decodes``), so the emulation below checks
    the kernel's own numbers against ``formats/``."""
    nvfp4_16, nvfp4_bf16 = source_defines("nvfp4", "fp16"), source_defines("nvfp4", "bf16")
    scale = {"perm": (nvfp4_16["SCALE_PERM_BASE"], nvfp4_16["SCALE_PERM_STEP"]),
             "bf16": (nvfp4_bf16["SCALE_MUL"], nvfp4_bf16["SCALE_ADD"]),
             "fp16": (nvfp4_16["SCALE_MUL"], nvfp4_16["SCALE_ADD"])}
    units = {"FP8 && BF16": source_defines("fp8", "bf16")["UNIT"], "FP8": source_defines("fp8", "fp16")["UNIT"],
             "BF16": nvfp4_bf16["UNIT"], "fp16": nvfp4_16["UNIT"]}
    return scale, {k: float(v) for k, v in units.items()}


def byte_perm(x: torch.Tensor, y: int, sel: int) -> torch.Tensor:
    """CUDA's __byte_perm(x, y, sel) (PRMT, default mode) on int64 words holding 32 bits."""
    pool = [(x >> (8 * i)) & 0xFF for i in range(4)] + [torch.full_like(x, (y >> (8 * i)) & 0xFF) for i in range(4)]
    return sum(pool[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def scale_pair(s: torch.Tensor, j: int, bf16: bool, consts) -> torch.Tensor:
    """weight_mma.cu's scale_pair in torch, with the source's constants (int64 words, 32-bit wrap)."""
    base, per_j = consts["perm"]
    mul, add = consts["bf16" if bf16 else "fp16"]
    return (byte_perm(s, 0, base | (per_j * j)) * mul + add) & 0xFFFFFFFF


def rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    """CUDA's __funnelshift_l(x, x, r) on int64 words holding 32 bits."""
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def decode_pair(w: torch.Tensor, p: int, bf16: bool) -> torch.Tensor:
    """weight_mma.cu's decode_pair in torch (int64 words holding 32 bits, logical shifts)."""
    b = [(w << 2) & 0x81C081C0, (w << 6) & 0x81C081C0, rotl(w, 12) & 0x81C081C0,
         (w & 0x81808180) | (rotl(w, 8) & 0x00400040)][p]
    return b if bf16 else ((b << 3) & 0x0E000E00) | (b & 0x80008000)


def test_nvfp4_pair_decode_and_scale_are_exact():
    """decode_pair on prepacked words / scale_pair / their product, with the kernel's own constants, times the
    epilogue's unit, equal e2m1 * bs exactly for every code in every pair slot and every non-zero E4M3 scale
    (as its prepacked byte, in each of the four byte slots of a scale word)."""
    from anyfp4.formats.fp8 import e4m3_decode as e4m3_to_float
    from anyfp4.formats.nvfp4 import e2m1_decode as e2m1_to_float
    from anyfp4.packing.nvfp4 import SCALE_BYTE, _spread_words

    consts, units = kernel_constants()
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    lo, hi = lo.reshape(-1), hi.reshape(-1)  # every (first, second) code pair
    e2m1 = torch.stack([e2m1_to_float(lo.to(torch.uint8)), e2m1_to_float(hi.to(torch.uint8))], -1).double()
    b = torch.arange(1, 0x7F, dtype=torch.int64)  # every non-zero scale (a zero scale's codes are zero)
    bs = e4m3_to_float(b.to(torch.uint8)).double()
    want = e2m1[None] * bs[:, None, None]
    # the scale word of a thread: the four bytes of (row g: blocks 2t, 2t + 1; row g + 8: the same), noise around
    gen = torch.Generator().manual_seed(1)
    code = SCALE_BYTE[b].to(torch.int64)
    for j in range(4):
        noise = [torch.randint(0, 151, b.shape, generator=gen) for _ in range(4)]
        noise[j] = code
        word = sum(n << (8 * i) for i, n in enumerate(noise))
        s16 = halves(scale_pair(word, j, False, consts), torch.float16)
        assert torch.equal(s16, torch.stack([bs, bs], -1)), j
        s_bf16 = halves(scale_pair(word, j, True, consts), torch.bfloat16)
        assert torch.equal(s_bf16, torch.stack([bs, bs], -1) * 2.0**118), j
    s16, sb = s16[:, 0], s_bf16[:, 0].bfloat16()
    gen = torch.Generator().manual_seed(0)
    for p in range(4):
        others = torch.randint(0, 16, (lo.numel(), 8), generator=gen)  # the other six codes of the word: noise
        others[:, p], others[:, p + 4] = lo, hi
        words = sum(others[:, i].to(torch.int64) << (4 * i) for i in range(8))
        spread = _spread_words(words.to(torch.int64).sub((words >> 31) << 32).to(torch.int32)).to(torch.int64)
        spread &= 0xFFFFFFFF
        # fp16: e2m1 * 2^-14; times bs in one fp16 rounding (mul.rn.f16x2) is exact
        w16 = halves(decode_pair(spread, p, False).to(torch.int32), torch.float16)
        assert torch.equal(w16, e2m1 * 2.0**-14), p
        prod16 = (w16[None].half() * s16[:, None, None].half()).double()
        assert torch.equal(prod16 * units["fp16"], want), p
        # bf16: e2m1 * 2^-126 (code 1 a subnormal); times bs * 2^118 in one rounding is exact
        w = halves(decode_pair(spread, p, True).to(torch.int32), torch.bfloat16)
        assert torch.equal(w, e2m1 * 2.0**-126), p
        prod = (w[None].bfloat16() * sb.bfloat16()[:, None, None]).double()
        assert torch.equal(prod * units["BF16"], want), p
        assert prod[prod != 0].abs().min() >= 2.0**-18  # far from float32 subnormals once times activations


def test_decode_pair_is_the_kernels():
    """The torch port above is the source's decode_pair, line for line."""
    src = weight_mma.source_text()
    for line in ["if (p == 0) return (w << 2) & 0x81C081C0u;",
                 "if (p == 1) return (w << 6) & 0x81C081C0u;",
                 "if (p == 2) return __funnelshift_l(w, w, 12) & 0x81C081C0u;",
                 "return (w & 0x81808180u) | (__funnelshift_l(w, w, 8) & 0x00400040u);",
                 "const u32 b = decode_pair_bf16(w, p);",
                 "return ((b << 3) & 0x0E000E00u) | (b & 0x80008000u);"]:
        assert line in src, line


def decode_e4m3_pair(w: torch.Tensor, p: int, bf16: bool) -> torch.Tensor:
    """weight_mma.cu's decode_e4m3_pair in torch before the bf16 multiply (int64 words holding 32 bits)."""
    if bf16:
        return w & 0x87F087F0 if p == 0 else ((w << 4) & 0x80F080F0) | (rotl(w, 12) & 0x07000700)
    if p == 0:
        return ((w << 3) & 0x3F803F80) | (w & 0x80008000)
    return ((w << 7) & 0x07800780) | (rotl(w, 15) & 0x38003800) | ((w << 4) & 0x80008000)


def test_fp8_pair_decode_is_exact():
    """Every finite E4M3 value in each of the four slots of a prepacked word (the other three random): pair 0 is
    (k0, k2), pair 1 (k1, k3), as fp16 e4m3 * 2^-8 and as bf16 e4m3 * 2^-120; the bf16 multiplier the kernel is
    compiled with (FP8_BF16_RESCALE, both halves 2^120, one exact bf16 rounding) and the epilogue's units give
    e4m3 back."""
    from anyfp4.formats.fp8 import e4m3_decode as e4m3_to_float
    from anyfp4.packing.fp8 import spread_fp8_words

    finite = torch.tensor([i for i in range(256) if (i & 0x7F) != 0x7F], dtype=torch.int64)
    _, units = kernel_constants()
    bits = torch.tensor([source_defines("fp8", "bf16")["FP8_BF16_RESCALE"]], dtype=torch.int64)
    rescale = halves((bits - ((bits >> 31) << 32)).to(torch.int32), torch.bfloat16)
    assert torch.equal(rescale, torch.tensor([[2.0**120, 2.0**120]], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    for slot in range(4):
        vals = [finite[torch.randint(0, finite.numel(), finite.shape, generator=gen)] for _ in range(4)]
        vals[slot] = finite
        words = sum(v << (8 * i) for i, v in enumerate(vals))
        spread = spread_fp8_words((words - ((words >> 31) << 32)).to(torch.int32)).to(torch.int64) & 0xFFFFFFFF
        ref = [e4m3_to_float(v.to(torch.uint8)).double() for v in vals]
        for p, (lo, hi) in enumerate([(0, 2), (1, 3)]):
            want = torch.stack([ref[lo], ref[hi]], -1)
            w16 = halves(decode_e4m3_pair(spread, p, False).to(torch.int32), torch.float16)
            assert torch.equal(w16, want * 2.0**-8) and torch.equal(w16 * units["FP8"], want), (slot, p)
            bf = halves(decode_e4m3_pair(spread, p, True).to(torch.int32), torch.bfloat16)
            assert torch.equal(bf * 2.0**120, want), (slot, p)
            rescaled = (bf.bfloat16() * rescale[0].bfloat16()).double()  # mul2's one bf16 rounding
            assert torch.equal(rescaled * units["FP8 && BF16"], want), (slot, p)


def test_fp8_pair_decode_is_the_kernels():
    src = weight_mma.source_text()
    for line in ["const u32 bits = p == 0 ? w & 0x87F087F0u",
                 ": ((w << 4) & 0x80F080F0u) | (__funnelshift_l(w, w, 12) & 0x07000700u);",
                 "if (p == 0) return ((w << 3) & 0x3F803F80u) | (w & 0x80008000u);",
                 "return ((w << 7) & 0x07800780u) | (__funnelshift_l(w, w, 15) & 0x38003800u) | ((w << 4) & 0x80008000u);",
                 "const u32 a0 = decode_e4m3_pair(va, 0), a2 = decode_e4m3_pair(va, 1);"]:
        assert line in src, line


def test_staging_permutation_matches_the_pairs():
    """The activation order staged per 8-group meets the weight pairs the kernel forms: for NVFP4 pair p of a
    prepacked word is (code p, code p + 4), for FP8 pairs are (byte 0, 2), (byte 1, 3) of each word."""
    nvfp4_b_order = [0, 4, 1, 5, 2, 6, 3, 7]  # x halves of the uint4 the kernel loads: (x0,x4),(x1,x5),...
    nvfp4_a_order = [k for h in range(4) for k in (h, h + 4)]
    assert nvfp4_a_order == nvfp4_b_order
    fp8_b_order = [0, 2, 1, 3, 4, 6, 5, 7]  # uint2 per word: (x0,x2),(x1,x3)
    fp8_a_order = [k for word in range(2) for k in (4 * word, 4 * word + 2, 4 * word + 1, 4 * word + 3)]
    assert fp8_a_order == fp8_b_order


VARIANTS = [  # (FP8, NT, MT, WARPS, DEPTH, BF16, GATED, HAS_BIAS): every value of every flag at least once (and KW)
    (0, 1, 1, 8, 2, 0, 0, 1), (0, 1, 2, 4, 4, 1, 0, 0), (0, 2, 1, 8, 2, 1, 1, 0), (0, 4, 1, 4, 2, 0, 1, 0),
    (0, 1, 1, 4, 8, 1, 0, 1), (1, 1, 1, 8, 2, 0, 0, 1), (1, 2, 2, 4, 4, 1, 0, 0), (1, 4, 1, 8, 2, 1, 1, 0),
    (0, 4, 4, 2, 2, 1, 0, 0), (1, 4, 4, 2, 2, 0, 0, 1),
]


@needs_nvrtc
@pytest.mark.parametrize("sm", [75, 80, 86, 89, 90])
def test_every_variant_compiles(sm):
    """Every flag value for every architecture (sm_75: the fp16 variants, two m16n8k8 mmas per product and staging
    through registers)."""
    src = weight_mma.source_text()
    for i, (fp8, nt, mt, warps, depth, bf16, gated, bias) in enumerate(VARIANTS):
        if bf16 and sm < weight_mma.ASYNC_SM:
            continue
        defines = dict(source_defines("fp8" if fp8 else "nvfp4", "bf16" if bf16 else "fp16"),
                       FP8=fp8, NT=nt, MT=mt, WARPS=warps, DEPTH=depth, BF16=bf16, GATED=gated, HAS_BIAS=bias,
                       OUT_F32=i % 2, EARLY=int(sm >= 90), VEC_X=int(i % 3 > 0), SPLIT=(1, 2, 6, 8, 16)[i % 5],
                       KW=(1, 2, 8, 4, 1, 8, 4, 1, 2, 1)[i], **weight_mma.arch_defines(sm),
                       SHARED_RING=int(sm >= weight_mma.ASYNC_SM and i % 2 == 0))
        cubin = nvrtc.compile_cubin(src, weight_mma.KERNEL, sm, defines)
        assert cubin[:4] == b"\x7fELF"


@needs_nvrtc
@pytest.mark.parametrize("gated, warps, depth, split", [(False, 4, 8, 8), (True, 4, 2, 8), (False, 8, 4, 1)])
def test_an_early_fp8_launch_loads_its_ring_before_it_waits(gated, warps, depth, split):
    """sm_90's early launch of FP8 weights (SASS, probes/ring_before_wait.py): the ring's whole first fill is issued
    before griddepcontrol.wait (ACQBULK), so the weights stream while the kernel before finishes, and no pointer but
    the weights' is read before it (configs where ptxas moved every plain load below the wait)."""
    loads, pointers = early_loads("fp8", gated, 1, warps, depth, 1, split)
    assert loads == depth * 2 * (2 if gated else 1)
    assert set(pointers) <= {"codes", "scales"}, pointers


@needs_nvrtc
def test_an_early_nvfp4_launch_leaves_its_ring_to_ptxas():
    """NVFP4's first fill stays plain loads (pinned before the wait it decoded 6% slower on an H100): in a config
    where ptxas moves them, none is before the wait — so the test above fails if FP8's pinning stops working, and
    this one if NVFP4 is pinned again without a new measurement."""
    loads, _ = early_loads("nvfp4", False, 1, 8, 8, 1, 1)
    assert loads == 0


def early_loads(fmt, gated, mt, warps, depth, kw, split):
    from helpers import load_script

    probe = load_script("probes/ring_before_wait.py")
    try:
        tool = probe.disassembler(None)
    except SystemExit:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one)")
    defines = dict(source_defines(fmt, "bf16"), FP8=int(fmt == "fp8"), NT=1, MT=mt, WARPS=warps, DEPTH=depth, BF16=1,
                   GATED=int(gated), HAS_BIAS=0, OUT_F32=0, EARLY=1, VEC_X=1, SPLIT=split, KW=kw,
                   **weight_mma.arch_defines(90))
    return probe.before_wait(weight_mma.source_text(), defines, tool)


def cuda_12_nvrtc() -> str | None:
    """CUDA 12's NVRTC from the nvidia-cuda-nvrtc-cu12 wheel, if installed (CUDA 13's refuses sm_70)."""
    import glob
    import os

    site = os.path.dirname(os.path.dirname(torch.__file__))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")))
    return found[0] if found else None


@pytest.mark.skipif(cuda_12_nvrtc() is None, reason="CUDA 12's NVRTC (nvidia-cuda-nvrtc-cu12) not installed")
def test_every_sm70_variant_compiles_with_cuda_12s_nvrtc():
    """sm_70's variants (each quad pair's m8n8k4 products), the fp16 ones whose sums fit (``fits_arch``), through
    ANYFP4_NVRTC in a process of their own (one NVRTC a process); none spills."""
    import json
    import os
    import subprocess
    import sys

    script = f"""
import json, re
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.cuda.counters import reserve_counters
from anyfp4.kernels.cuda.weight_mma_defines import source_defines
assert nvrtc.version()[0] == 12, nvrtc.version()
out = []
for i, (fp8, nt, mt, warps, depth, bf16, gated, bias) in enumerate({VARIANTS!r}):
    if bf16 or not weight_mma.fits_arch(70, mt, nt, True):
        continue
    defines = dict(source_defines("fp8" if fp8 else "nvfp4", "fp16"), FP8=fp8, NT=nt, MT=mt, WARPS=warps,
                   DEPTH=depth, BF16=0, GATED=gated, HAS_BIAS=bias, OUT_F32=i % 2, EARLY=0, VEC_X=int(i % 3 > 0),
                   SPLIT=(1, 2, 6, 8, 16)[i % 5], KW=(1, 2, 8, 4, 1, 8, 4, 1, 2, 1)[i], **weight_mma.arch_defines(70))
    assert defines["QUAD_PAIRS"] == 1
    cubin = nvrtc.compile_cubin(weight_mma.source_text(), weight_mma.KERNEL, 70, defines)
    log = nvrtc.ptxas_report(weight_mma.source_text(), weight_mma.KERNEL, 70, defines)
    spills = [int(n) for n in re.findall(r"(\\d+) bytes spill", log)]
    out.append([cubin[:4] == b"\\x7fELF", sum(spills)])
print(json.dumps(out))
"""
    env = dict(os.environ, ANYFP4_NVRTC=cuda_12_nvrtc())
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    want = sum(1 for v in VARIANTS if not v[5] and weight_mma.fits_arch(70, v[2], v[1], True))
    assert len(rows) == want >= 3 and all(elf and spills == 0 for elf, spills in rows), rows


def test_a_named_nvrtc_that_does_not_load_is_a_clear_error(tmp_path, monkeypatch):
    import anyfp4.kernels.cuda.nvrtc as nvrtc_module

    monkeypatch.setenv("ANYFP4_NVRTC", str(tmp_path / "libnvrtc.so.12"))
    nvrtc_module._nvrtc.cache_clear()
    try:
        with pytest.raises(nvrtc_module.NVRTCError, match="ANYFP4_NVRTC=.*libnvrtc.so.12: cannot load it"):
            nvrtc_module._nvrtc()
    finally:
        monkeypatch.delenv("ANYFP4_NVRTC")
        nvrtc_module._nvrtc.cache_clear()


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_launch_defines_are_the_layouts_and_the_decodes(fmt, dtype):
    """Every launch (the GPU's through NVRTC and the host build's: both compile ``plan_launch``'s defines) hands the
    source the tile geometry of packing/layout.py, a step of one tile row of words, the staging of ``STAGING`` (the
    shared memory it asks for matches it) and the decode constants the emulation tests above check exact."""
    from anyfp4.formats.nvfp4 import GROUP_SIZE
    from anyfp4.packing import fp8 as fp8_packing
    from anyfp4.packing import layout
    from anyfp4.packing import nvfp4 as nvfp4_packing

    gen = torch.Generator().manual_seed(3)
    if fmt == "nvfp4":
        p = prepack_nvfp4(nvfp4_weight(200, 1040, gen, torch.tensor(1e-3), device="cpu"))
        scales, gscale, k_per_word = p.scales, p.global_scale, nvfp4_packing.K_PER_WORD
    else:
        p = prepack_fp8(quantize_fp8(torch.randn(200, 1040, generator=gen)))
        scales, gscale, k_per_word = None, p.scales, fp8_packing.K_PER_WORD
    half = "bf16" if dtype == torch.bfloat16 else "fp16"
    m = 5
    plan = weight_mma.plan_launch(fmt, torch.zeros(m, 1040, dtype=dtype), p.codes, scales, gscale, None,
                                  p.out_features, 0, MMAConfig(), None, None, stage_bytes=weight_mma.STAGE_BYTES,
                                  early=False, counters=None)
    d = plan.defines
    assert {name: d[name] for name in source_defines(fmt, half)} == source_defines(fmt, half)
    assert (d["TILE_ROWS"], d["TILE_WORDS"], d["TILE_BLOCKS"]) == (layout.TILE_ROWS, layout.TILE_WORDS,
                                                                   layout.TILE_BLOCKS)
    assert d["STEP"] == layout.TILE_WORDS * k_per_word == weight_mma.STEP_K[fmt]
    if fmt == "nvfp4":  # a step's scale bytes cover its k
        assert d["TILE_BLOCKS"] * GROUP_SIZE == d["STEP"]
    # one step of a row block is one tile: TILE_ROWS x TILE_WORDS consecutive words
    words_per_row = p.codes.shape[1]
    assert layout.tiled_word_offset(0, layout.TILE_WORDS, words_per_row) == layout.TILE_ROWS * layout.TILE_WORDS
    assert (d["X_T"], d["X_Q"], d["XS_PAD"]) == staged_layout(fmt)
    kc = plan.args[18]  # the last of the 11 ints after the 8 pointers (the grouped launch's come after it)
    assert plan.shared_bytes == m * (kc // 2 + d["XS_PAD"]) * 4
    assert (d["FP8"], d["BF16"]) == (int(fmt == "fp8"), int(half == "bf16"))
    scale, units = kernel_constants()
    key = {("nvfp4", "fp16"): "fp16", ("nvfp4", "bf16"): "BF16", ("fp8", "fp16"): "FP8",
           ("fp8", "bf16"): "FP8 && BF16"}[fmt, half]
    assert d["UNIT"] == units[key] and (d["SCALE_MUL"], d["SCALE_ADD"]) == scale[half]


def test_stage_k_fits_the_shared_memory_it_is_given():
    for m, fmt in itertools.product(range(1, 33), weight_mma.STEP_K):
        for cap in (32 * 1024, 99 * 1024, 128 * 1024):
            kc = weight_mma.stage_k(m, cap, fmt=fmt)
            assert 128 <= kc <= 4096 and kc & (kc - 1) == 0
            assert weight_mma_geometry.stage_bytes_for(m, kc, fmt) <= cap or kc == 128
            assert kc == 4096 or weight_mma_geometry.stage_bytes_for(m, 2 * kc, fmt) > cap  # the largest that fits


def test_rounds_are_whole_passes_of_the_ring_on_every_supported_gpu():
    """The kernel stages activations only at the start of a pass over its ring: kc must be a multiple of
    DEPTH steps. The smallest opt-in shared memory of an sm_80+ GPU (99 KiB on sm_86/89, less 1 KiB) fits that
    for every M and depth, so the launcher's error for it cannot fire there."""
    for m in range(1, 33):
        for fmt, step in weight_mma.STEP_K.items():
            for depth in (2, 4, 8):
                least = depth * step
                kc = weight_mma.stage_k(m, 99 * 1024 - 1024, least, fmt)
                assert kc % least == 0 and weight_mma_geometry.stage_bytes_for(m, kc, fmt) <= 99 * 1024 - 1024


def staged_layout(fmt):
    """X_T, X_Q, XS_PAD as the kernel is compiled with them for ``fmt`` (``STAGING``, through ``source_defines``)."""
    s = STAGING[fmt]
    assert s.pad == XS_PAD[fmt]
    return s.x_t, s.x_q, s.pad


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_fragment_loads_meet_no_bank_conflict(fmt):
    """Each shared-memory load of B fragments (NVFP4: 16 bytes per thread, served a quarter warp at a time; FP8:
    8 bytes, a half warp at a time) touches every bank at most once per address, for every M (rows past M - 1
    read row M - 1), n8 tile, word q and staging width; the staging places each 8-group where they read it."""
    x_t, x_q, pad = staged_layout(fmt)
    width, lanes = (4, 8) if fmt == "nvfp4" else (2, 16)  # words per load, lanes served together
    for kc, m, b, q in itertools.product((128, 512, 4096), range(1, 33), range(4), range(4)):
        stride = kc // 2 + pad
        for first in range(0, 32, lanes):
            banks = {}
            for lane in range(first, first + lanes):
                g, t = lane >> 2, lane & 3
                word = min(b * 8 + g, m - 1) * stride + t * x_t + q * x_q
                assert word % width == 0
                for w in range(word, word + width):
                    banks.setdefault(w % 32, set()).add(w)
            assert max(len(words) for words in banks.values()) == 1, (fmt, kc, m, b, q)
    # the staging's placement of 8-group grp (the source's staged_word) is where thread t reads word q
    per_step = 16 if fmt == "nvfp4" else 8
    for grp in range(3 * per_step):
        step, i = divmod(grp, per_step)
        placed = grp * 4 if fmt == "fp8" else (grp & ~15) * 4 + (grp & 3) * x_q + ((grp >> 2) & 3) * x_t
        if fmt == "nvfp4":  # group i of a step: k 8i..8i+7, thread t = i // 4's word q = i % 4
            assert placed == step * 64 + (i // 4) * x_t + (i % 4) * x_q
        else:  # group i: thread t = i // 2's words q = 2 (i % 2), 2 (i % 2) + 1
            assert placed == step * 32 + (i // 2) * x_t + 2 * (i % 2) * x_q
    assert "return (grp & ~15) * 4 + (grp & 3) * X_Q + ((grp >> 2) & 3) * X_T;" in weight_mma.source_text()


def test_heuristic_configs_fit_every_prepack():
    for n, k, m, gated, fmt in itertools.product([128, 4120, 14336], [256, 1552, 8192], [1, 8, 32], [False, True],
                                                 ["nvfp4", "fp8"]):
        c = tuning.mma_heuristic_config(n, -(-k // 256) * 256, m, 132, gated, fmt)
        assert weight_mma.rows_per_block(c) == 128 and c.split_k >= 1


def square_case(seed: int, *x_shape: int, dtype=torch.bfloat16):
    """A seeded 4096 x 4096 NVFP4 weight, its prepack and activations of shape (*x_shape, 4096)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = nvfp4_weight(4096, 4096, gen, torch.tensor(1e-3, device="cuda"))
    x = torch.randn(*x_shape, 4096, device="cuda", generator=gen).to(dtype)
    return w, prepack_nvfp4(w), x


def linear(x, p):
    """torch.ops.anyfp4.nvfp4_linear over prepack ``p``, no bias."""
    return torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, p.out_features, p.in_features)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nvfp4_kernel_against_reference(dtype):
    gen = torch.Generator(device="cuda").manual_seed(11)
    n, k = 4224, 1552
    gs = torch.tensor(2e-3, device="cuda")
    w, gate, up = (nvfp4_weight(n, k, gen, gs) for _ in range(3))
    p, pg = prepack_nvfp4(w), prepack_nvfp4_gated(gate, up)
    wd, gd, ud = (dequantize_nvfp4(t).double() for t in (w, gate, up))
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    check_kernel(nvfp4_mma_gemm, p, pg, wd, gd, ud, bias, sweep_cases([1, 2, 7, 8, 9, 16, 17, 32]), gen)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_kernel_against_reference(dtype, per_channel):
    g = torch.Generator(device="cuda").manual_seed(12)
    n, k = 4224, 1552
    w, gate, up = (quantize_fp8(torch.randn(n, k, device="cuda", generator=g), per_channel=per_channel)
                   for _ in range(3))
    p, pg = prepack_fp8(w), prepack_fp8_gated(gate, up)
    wd, gd, ud = (dequantize_fp8(t).double() for t in (w, gate, up))
    bias = torch.randn(n, device="cuda", generator=g).to(dtype)
    check_kernel(fp8_mma_gemm, p, pg, wd, gd, ud, bias, sweep_cases([1, 3, 8, 12, 32]), g)


def variant_gemm(fmt: str, sm: int):
    """``nvfp4_mma_gemm`` / ``fp8_mma_gemm`` (same arguments) with sm_``sm``'s variant of the source compiled for this
    GPU: sm_70's m8n8k4 and sm_75's m16n8k8 are valid on later ones too."""

    def call(x, p, bias, config, out=None, out_dtype=None):
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        stage_bytes = min(weight_mma.STAGE_BYTES, nvrtc.max_shared_memory(device) - 1024)
        counters = reserve_counters(x.device) if config.split_k > 1 else None
        scales, gscale = (p.scales, p.global_scale) if fmt == "nvfp4" else (None, p.scales)
        plan = weight_mma.plan_launch(fmt, x, p.codes, scales, gscale, bias, p.out_features, p.up_offset, config,
                                      out, out_dtype, stage_bytes=stage_bytes, early=False, counters=counters, sm=sm)
        kernel = nvrtc.load(weight_mma.source_text(), weight_mma.KERNEL, plan.defines, device, shared_memory=stage_bytes)
        kernel.launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=False)
        return plan.out

    return call


@gpu
@pytest.mark.parametrize("sm", [70, 75])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_older_architectures_variants_run_on_this_gpu(fmt, sm):
    """sm_70's variant (each quad pair's m8n8k4 products) and sm_75's (two m16n8k8 per product), fp16, on real
    mma.sync: the reference on odd shapes (N = 4120, K = 1536 + 16) for M up to 32 (the launches whose sums fit),
    deterministic, and a row's bits the same in a call of 1, 9 or 32 rows."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    n, k = 4120, 1552
    if fmt == "nvfp4":
        w, gate, up = (nvfp4_weight(n, k, gen, torch.tensor(2e-3, device="cuda")) for _ in range(3))
        p, pg = prepack_nvfp4(w), prepack_nvfp4_gated(gate, up)
        wd, gd, ud = (dequantize_nvfp4(t).double() for t in (w, gate, up))
    else:
        w, gate, up = (quantize_fp8(torch.randn(n, k, device="cuda", generator=gen), per_channel=pc)
                       for pc in (True, False, True))
        p, pg = prepack_fp8(w), prepack_fp8_gated(gate, up)
        wd, gd, ud = (dequantize_fp8(t).double() for t in (w, gate, up))
    bias = torch.randn(n, device="cuda", generator=gen).half()
    cases = [(m, c) for m, c in sweep_cases([1, 7, 9, 17, 32])
             if weight_mma.fits_arch(sm, c.mt, weight_mma.n_tiles_for(m), True)]
    assert len(cases) >= 10
    run = variant_gemm(fmt, sm)
    check_kernel(run, p, pg, wd, gd, ud, bias, cases, gen)
    x = torch.randn(32, k, device="cuda", generator=gen).half()
    config = MMAConfig(1, 4, 4, 2)
    singles = [run(x[i:i + 1], p, None, config) for i in (0, 8)]
    for m in (9, 32):
        y = run(x[:m], p, None, config)
        assert all(torch.equal(y[i:i + 1], s) for i, s in zip((0, 8), singles)), m


@gpu
def test_kernel_switch_is_read_inside_the_op(monkeypatch):
    w, p, x = square_case(13, 4)
    ref = x.double() @ dequantize_nvfp4(w).double().t()
    for choice in ("auto", "cuda", "triton"):
        monkeypatch.setenv("ANYFP4_KERNELS", choice)
        assert rel_err(linear(x, p), ref) < 4e-3
    monkeypatch.setenv("ANYFP4_KERNELS", "fastest")
    with pytest.raises(ValueError, match="ANYFP4_KERNELS"):
        linear(x, p)


def test_k_slices_do_not_depend_on_m():
    """Only the K slices (split-K x K warps) set a row's summation order in the CUDA kernel, so they come from M = 1
    for every M, and every config the tuning gives can be launched (K warps only where they apply)."""
    from anyfp4.dispatch.launch_tables import builtin_mma_table
    from anyfp4.dispatch.tuning import mma_config

    shapes = {(key[1], key[2], key[3], key[4]) for key in builtin_mma_table()} | {("nvfp4", False, 576, 1536)}
    for fmt, gated, k, n in shapes:
        k_pad = -(-k // 256) * 256
        configs = [mma_config(90, 132, fmt, gated, n, k, k_pad, m) for m in range(1, 33)]
        slices = {weight_mma.k_slices(c) for c in configs}
        assert len(slices) == 1, (fmt, gated, k, n, slices)
        steps = k_pad // weight_mma.STEP_K[fmt]
        for m, c in enumerate(configs, 1):
            assert c.kw == 1 or (steps % weight_mma.k_slices(c) == 0 and c.warps % c.kw == 0
                                 and weight_mma_geometry.least_shared_bytes(c, m, gated, fmt) <= weight_mma.STAGE_BYTES), c


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rows_do_not_depend_on_the_batch(dtype):
    """Through the op, each row of an M-row call has the bits of a one-row call (what makes a speculative
    verify pass reproduce single-token decoding)."""
    _, p, x = square_case(14, 32, dtype=dtype)
    singles = torch.cat([linear(x[i:i + 1], p) for i in range(32)])
    for m in (2, 5, 8, 9, 16, 17, 32):
        assert torch.equal(linear(x[:m], p), singles[:m]), m


@gpu
def test_early_launch_waits_for_the_kernel_before_it(monkeypatch):
    """Captured in one graph, each call reads activations the kernel just before it wrote: with the early
    (programmatic dependent) launch on sm_90 the outputs equal the plainly launched ones bit for bit."""
    _, p, a = square_case(15, 20, 1)
    monkeypatch.setenv("ANYFP4_EARLY_LAUNCH", "0")
    want = [linear(a[i] * 3, p) for i in range(20)]
    monkeypatch.setenv("ANYFP4_EARLY_LAUNCH", "1")
    x = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
    linear(x, p)  # compiled and loaded before capture
    torch.cuda.synchronize()
    graph, ys = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        for i in range(20):
            torch.mul(a[i], 3, out=x)
            ys.append(linear(x, p))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, r) for y, r in zip(ys, want))


@gpu
def test_early_launches_in_a_chain_wait_for_each_other(monkeypatch):
    """Each call reads the output of the call before it (a kernel that lets the next start early, the next reading
    what it writes): captured in one graph, the chain's bits equal plainly launched calls', for K warps and split-K
    configs alike."""
    from anyfp4.formats.nvfp4 import NVFP4Weight

    w, p, x0 = square_case(19, 1)
    gain = (linear(x0, p).float().norm() / x0.float().norm()).item()  # a global scale that keeps the size of x
    p = prepack_nvfp4(NVFP4Weight(w.packed, w.block_scale, w.global_scale / gain))
    for config in (MMAConfig(1, 8, 16, 2), MMAConfig(1, 8, 1, 4, 8), MMAConfig(1, 8, 2, 2, 4)):
        def run(x):
            return weight_mma.nvfp4_mma_gemm(x, p, None, config)

        monkeypatch.setenv("ANYFP4_EARLY_LAUNCH", "0")
        want, x = [], x0
        for _ in range(12):
            x = run(x)
            want.append(x)
        monkeypatch.setenv("ANYFP4_EARLY_LAUNCH", "1")
        run(x0)  # compiled and loaded before capture
        torch.cuda.synchronize()
        graph, ys = torch.cuda.CUDAGraph(), []
        with torch.cuda.graph(graph):
            x = x0
            for _ in range(12):
                x = run(x)
                ys.append(x)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(y, r) for y, r in zip(ys, want)), config
        assert torch.isfinite(want[-1]).all() and want[-1].abs().max() > 0, config


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_k_warps_add_up_as_split_k_does_on_the_gpu(fmt):
    """On the device: split S / kw over kw K warps gives the float32 sums of split S alone, at every n8-tile count."""
    gen = torch.Generator(device="cuda").manual_seed(20)
    n, k = 4096, 4096
    if fmt == "nvfp4":
        p, run = prepack_nvfp4(nvfp4_weight(n, k, gen, torch.tensor(1e-3, device="cuda"))), weight_mma.nvfp4_mma_gemm
    else:
        p = prepack_fp8(quantize_fp8(torch.randn(n, k, device="cuda", generator=gen), per_channel=True))
        run = weight_mma.fp8_mma_gemm
    for m, (slices, kw, warps, mt, depth) in [(1, (8, 8, 8, 1, 4)), (1, (16, 2, 8, 2, 2)), (8, (4, 4, 4, 1, 2)),
                                               (16, (16, 4, 8, 2, 2)), (32, (8, 2, 8, 1, 2))]:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        alone, spread = MMAConfig(mt, warps, slices, depth), MMAConfig(mt, warps, slices // kw, depth, kw)
        sums = run(x, p, None, spread, out_dtype=torch.float32)
        assert torch.equal(sums, run(x, p, None, alone, out_dtype=torch.float32)), (m, spread)
        assert sums.abs().max() > 0


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_a_shared_ring_gives_the_register_rings_bits_on_the_gpu(fmt):
    """On the device: the ring of code words in shared memory (cp.async) gives the float32 sums and the outputs of the
    register ring with the same slices — plain, split-K, K warps, gated, one to four n8 tiles, early launch as
    served; poisoned outputs all written."""
    gen = torch.Generator(device="cuda").manual_seed(33)
    n, k = 4096, 4096
    if fmt == "nvfp4":
        w, g, u = (nvfp4_weight(n, k, gen, torch.tensor(1e-3, device="cuda")) for _ in range(3))
        p, pg, run = prepack_nvfp4(w), prepack_nvfp4_gated(g, u), weight_mma.nvfp4_mma_gemm
    else:
        w, g, u = (quantize_fp8(torch.randn(n, k, device="cuda", generator=gen), per_channel=True) for _ in range(3))
        p, pg, run = prepack_fp8(w), prepack_fp8_gated(g, u), weight_mma.fp8_mma_gemm
    for m, cfg in [(1, MMAConfig(1, 8, 1, 8)), (1, MMAConfig(1, 8, 16, 2)), (1, MMAConfig(1, 8, 2, 4, 4)),
                   (4, MMAConfig(2, 8, 8, 4)), (16, MMAConfig(1, 4, 4, 4)), (32, MMAConfig(1, 8, 2, 2, 2))]:
        ring = MMAConfig(cfg.mt, cfg.warps, cfg.split_k, cfg.depth, cfg.kw, shared_ring=1)
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        sums = run(x, p, None, ring, out_dtype=torch.float32)
        assert torch.equal(sums, run(x, p, None, cfg, out_dtype=torch.float32)), (m, ring)
        assert sums.abs().max() > 0
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert torch.equal(run(x, p, None, ring, out=out), run(x, p, None, cfg)), (m, ring)
        if cfg.mt == 1 and m <= 16 and cfg.depth <= 4:  # a gated ring of 8 is more shared memory than a block gets
            assert torch.equal(run(x, pg, None, ring), run(x, pg, None, cfg)), (m, ring)


def test_a_sweep_file_overrides_the_launch_table(tmp_path, monkeypatch):
    """ANYFP4_MMA_TABLE: the best configs of an mma_sweep.py file win over the built-in table and the heuristic;
    the split still comes from the M = 1 entry; a file that is not a sweep is a clear error."""
    import json

    from anyfp4.dispatch.tuning import mma_config

    sweep = {"sm": 90, "sweep": [
        {"format": "nvfp4", "n": 6144, "k": 4096, "m": 1, "best_cfg": {"mt": 1, "warps": 4, "split_k": 2, "depth": 8}},
        {"format": "nvfp4", "n": 6144, "k": 4096, "m": 8, "best_cfg": {"mt": 2, "warps": 8, "split_k": 16, "depth": 2}}],
        "gated": [{"format": "nvfp4", "n": 7168, "k": 4096, "m": 1,
                   "best_cfg": {"mt": 1, "warps": 8, "split_k": 4, "depth": 4}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    before = mma_config(90, 132, "nvfp4", False, 6144, 4096, 4096, 1)
    monkeypatch.setenv("ANYFP4_MMA_TABLE", str(path))
    assert mma_config(90, 132, "nvfp4", False, 6144, 4096, 4096, 1) == MMAConfig(1, 4, 2, 8) != before
    assert mma_config(90, 132, "nvfp4", False, 6144, 4096, 4096, 7) == MMAConfig(2, 8, 2, 2)  # bucket 8, split of M=1
    assert mma_config(90, 132, "nvfp4", True, 7168, 4096, 4096, 1) == MMAConfig(1, 8, 4, 4)
    assert mma_config(80, 108, "nvfp4", False, 6144, 4096, 4096, 1) != MMAConfig(1, 4, 2, 8)  # another GPU: not it
    bad = tmp_path / "bad.json"
    bad.write_text('{"sweep": [{"n": 1}]}')
    monkeypatch.setenv("ANYFP4_MMA_TABLE", str(bad))
    with pytest.raises(ValueError, match="ANYFP4_MMA_TABLE"):
        mma_config(90, 132, "nvfp4", False, 6144, 4096, 4096, 1)


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_two_ranks_shares_add_up_to_one_gpus_bits(fmt, dtype):
    """What tensor parallelism over two GPUs relies on: rows of a layer (column-parallel) computed with the full
    layer's split give its bits; the two halves of K (row-parallel), each with half the split and summed in
    float32 before the scale, give the full layer's bits too (the even split adds its halves separately)."""
    from anyfp4.dispatch.tuning import mma_config
    from anyfp4.parallel.sharding import shard_cols, shard_rows

    gen = torch.Generator(device="cuda").manual_seed(16)
    n, k = 4096, 4096
    if fmt == "nvfp4":
        w = nvfp4_weight(n, k, gen, torch.tensor(1e-3, device="cuda"))
        pack, op, part = prepack_nvfp4, torch.ops.anyfp4.nvfp4_linear, torch.ops.anyfp4.nvfp4_linear_partial
        call = lambda x, p, s: op(x, p.codes, p.scales, p.global_scale, None, p.out_features, p.in_features, s)  # noqa: E731
        share = lambda x, p, s: part(x, p.codes, p.scales, p.global_scale, p.out_features, p.in_features, s)  # noqa: E731
        scale = lambda p: p.global_scale  # noqa: E731
    else:
        w = quantize_fp8(torch.randn(n, k, device="cuda", generator=gen), per_channel=True)
        pack, op, part = prepack_fp8, torch.ops.anyfp4.fp8_linear, torch.ops.anyfp4.fp8_linear_partial
        call = lambda x, p, s: op(x, p.codes, p.scales, None, p.out_features, p.in_features, s)  # noqa: E731
        share = lambda x, p, s: part(x, p.codes, p.scales, p.out_features, p.in_features, s)  # noqa: E731
        scale = lambda p: p.scales[: p.out_features]  # noqa: E731
    from anyfp4.kernels.device import device_arch

    p = pack(w)
    split = mma_config(*device_arch(torch.cuda.current_device()), fmt, False, n, k, k, 1).split_k
    split += split % 2  # an even split (the launch table's for this shape on the H200)
    top, left, right = pack(shard_rows(w, 0, n // 2)), pack(shard_cols(w, 0, k // 2)), pack(shard_cols(w, k // 2, k))
    for m in (1, 5, 32):
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        y = call(x, p, split)
        assert torch.equal(call(x, top, split), y[:, : n // 2]), m
        total = share(x[:, : k // 2].contiguous(), left, split // 2) + share(x[:, k // 2:].contiguous(), right, split // 2)
        assert torch.equal((total * scale(p)).to(dtype), y), m


@gpu
def test_chunked_prefill_gives_each_row_the_decode_bits(monkeypatch):
    """ANYFP4_PREFILL=chunked: 100 rows go through the decode kernel 32 at a time, each row as a one-row call."""
    w, p, x = square_case(17, 100)
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    y = linear(x, p)
    for i in (0, 31, 32, 99):
        assert torch.equal(y[i:i + 1], linear(x[i:i + 1], p)), i
    assert rel_err(y, x.double() @ dequantize_nvfp4(w).double().t()) < 4e-3


@needs_nvrtc
def test_turings_variant_keeps_its_registers():
    """sm_75's fp16 variant of the common M <= 8 family: ptxas reports no spills (benchmarks/probes/register_counts.py
    lists every family)."""
    import re

    defines = dict(source_defines("nvfp4", "fp16"), FP8=0, NT=1, MT=1, WARPS=8, DEPTH=4, BF16=0, GATED=1, HAS_BIAS=0,
                   OUT_F32=0, EARLY=0, VEC_X=1, SPLIT=4, KW=1, MMA_K8=1, ASYNC_COPY=0)
    log = nvrtc.ptxas_report(weight_mma.source_text(), weight_mma.KERNEL, 75, defines)
    assert "for 'sm_75'" in log and re.search(r"Used \d+ registers", log)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
