"""Triton kernels against the formats/ reference, on fresh random inputs, outputs poisoned first.
Run by Triton's CPU interpreter without a GPU (tiny sizes), natively with one."""

import pytest
import torch

from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4
from anyfp4.dispatch.configs import DecodeConfig
from anyfp4.kernels.triton.nvfp4_decode import nvfp4_decode_gemm
from anyfp4.kernels.triton.nvfp4_dequant import nvfp4_dequantize, nvfp4_prefill_gemm
from anyfp4.kernels.triton.nvfp4_gemv import nvfp4_gemv
from anyfp4.dispatch.tuning import gemv_heuristic_config
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

DTYPES = [torch.float16, torch.bfloat16]


def random_weight(n, k, gen, device, global_scale=None):
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen).to(device)
    scales = torch.randint(0, 0x7E, (n, k // 16), dtype=torch.uint8, generator=gen).to(device)
    gs = torch.rand((), generator=gen) * 1e-2 + 1e-4 if global_scale is None else global_scale
    return NVFP4Weight(packed, scales.view(torch.float8_e4m3fn), gs.to(device))


def tolerance(dtype):
    return 2e-3 if dtype == torch.float16 else 8e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, k", [(72, 272), (40, 16)])
def test_dequant_bit_exact(device, dtype, n, k):
    gen = torch.Generator().manual_seed(n * k)
    w = random_weight(n, k, gen, device)
    out = torch.full((n, k), float("nan"), dtype=dtype, device=device)
    nvfp4_dequantize(prepack_nvfp4(w), dtype, out)
    assert torch.equal(out, dequantize_nvfp4(w).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 17])
@pytest.mark.parametrize("config", [DecodeConfig(32, 256, 1), DecodeConfig(64, 128, 2)])
def test_decode_matches_reference_pack_on_off(device, dtype, m, config):
    n, k = 72, 528  # neither a tile multiple
    gen = torch.Generator().manual_seed(m)
    w = random_weight(n, k, gen, device)
    p = prepack_nvfp4(w)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    ref = x.float() @ dequantize_nvfp4(w).t() + bias.float()
    outs = []
    for pack in (False, True):
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        y = nvfp4_decode_gemm(x, p, bias, config, act_pack=pack, out=out)
        assert not torch.isnan(y).any()
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err < tolerance(dtype), err
        outs.append(y)
    assert torch.equal(outs[0], outs[1])  # the activation block-pack is pure data movement
    assert torch.equal(outs[0], nvfp4_decode_gemm(x, p, bias, config))  # deterministic


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_decode_and_prefill(device, dtype):
    n, k = 40, 272
    gen = torch.Generator().manual_seed(7)
    gate = random_weight(n, k, gen, device)
    up = random_weight(n, k, gen, device, global_scale=gate.global_scale.cpu())
    p = prepack_nvfp4_gated(gate, up)
    for m, split in ((3, 1), (3, 2)):
        x = torch.randn(m, k, generator=gen).to(dtype).to(device)
        ref = torch.nn.functional.silu(x.float() @ dequantize_nvfp4(gate).t()) * (x.float() @ dequantize_nvfp4(up).t())
        y = nvfp4_decode_gemm(x, p, None, DecodeConfig(32, 128, split))
        assert y.shape == (m, n)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 2 * tolerance(dtype)
    if device.type == "cuda":  # prefill uses cuBLAS
        x = torch.randn(64, k, generator=gen).to(dtype).to(device)
        ref = torch.nn.functional.silu(x.float() @ dequantize_nvfp4(gate).t()) * (x.float() @ dequantize_nvfp4(up).t())
        y = nvfp4_prefill_gemm(x, p, None)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 2 * tolerance(dtype)


def test_large_fp16_activations_stay_finite(device):
    n, k = 32, 256
    gen = torch.Generator().manual_seed(3)
    w = random_weight(n, k, gen, device, global_scale=torch.tensor(1e-5))
    x = ((torch.rand(2, k, generator=gen) * 2 - 1) * 6e4).to(torch.float16).to(device)
    ref = x.float() @ dequantize_nvfp4(w).t()
    assert ref.abs().max() < 6e4  # the true result is finite in fp16
    y = nvfp4_decode_gemm(x, prepack_nvfp4(w), None, DecodeConfig(32, 256, 1))
    assert torch.isfinite(y).all()
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [DecodeConfig(8, 256, 1, 2, 1), DecodeConfig(16, 256, 3, 2, 1), None])
def test_gemv_matches_reference(device, dtype, config):
    n, k = 72, 528  # K not a multiple of the K tile: activations are masked, weights padded
    gen = torch.Generator().manual_seed(11)
    w = random_weight(n, k, gen, device)
    p = prepack_nvfp4(w)
    config = config or gemv_heuristic_config(n, p.codes.shape[1] * 8, 132)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    ref = x.float() @ dequantize_nvfp4(w).t() + bias.float()
    out = torch.full((1, n), float("nan"), dtype=dtype, device=device)
    y = nvfp4_gemv(x, p, bias, config, out=out)
    assert not torch.isnan(y).any()
    assert ((y.float() - ref).norm() / ref.norm()).item() < tolerance(dtype)
    assert torch.equal(y, nvfp4_gemv(x, p, bias, config))


@pytest.mark.parametrize("split", [1, 2])
def test_gemv_gated(device, split):
    n, k = 40, 512
    gen = torch.Generator().manual_seed(12)
    gate = random_weight(n, k, gen, device)
    up = random_weight(n, k, gen, device, global_scale=gate.global_scale.cpu())
    p = prepack_nvfp4_gated(gate, up)
    x = torch.randn(1, k, generator=gen).to(torch.float16).to(device)
    ref = torch.nn.functional.silu(x.float() @ dequantize_nvfp4(gate).t()) * (x.float() @ dequantize_nvfp4(up).t())
    y = nvfp4_gemv(x, p, None, DecodeConfig(8, 256, split, 2, 1))
    assert ((y.float() - ref).norm() / ref.norm()).item() < 4e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("swap", [False, True])
def test_fused_prefill_gemm(device, dtype, split, swap):
    """ANYFP4_PREFILL=fused: the decode kernel over several row tiles, whole K or in 4 K slices of one tile each, the
    decoded tile either operand of the multiply — plain + bias, gated, the float32 share; every output written
    (poisoned first), repeated runs identical."""
    from anyfp4.dispatch.configs import FusedConfig
    from anyfp4.kernels.triton.nvfp4_decode import nvfp4_fused_gemm

    n, k, m = 130, 272, 40  # 3 row tiles of 16 (the last partial), 3 column tiles of 64
    gen = torch.Generator().manual_seed(9)
    w, gate = random_weight(n, k, gen, device), random_weight(n, k, gen, device)
    up = random_weight(n, k, gen, device, global_scale=gate.global_scale.cpu())
    p, pg = prepack_nvfp4(w), prepack_nvfp4_gated(gate, up)
    cfg = FusedConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=1, split_k=split, swap_ab=swap)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    y = nvfp4_fused_gemm(x, p, bias, cfg, out=out)
    ref = x.float() @ dequantize_nvfp4(w).t() + bias.float()
    assert not torch.isnan(y).any()
    assert ((y.float() - ref).norm() / ref.norm()).item() < tolerance(dtype)
    assert torch.equal(y, nvfp4_fused_gemm(x, p, bias, cfg))
    yg = nvfp4_fused_gemm(x, pg, None, cfg)
    gref = torch.nn.functional.silu(x.float() @ dequantize_nvfp4(gate).t()) * (x.float() @ dequantize_nvfp4(up).t())
    assert ((yg.float() - gref).norm() / gref.norm()).item() < 2 * tolerance(dtype)
    y32 = nvfp4_fused_gemm(x, p, None, cfg, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    ref32 = x.double() @ dequantize_nvfp4(w).double().t()
    assert ((y32.double() - ref32).norm() / ref32.norm()).item() < 1e-5  # fp32 accumulation of exact products
    with pytest.raises(ValueError, match="block_k 96 must divide"):
        nvfp4_fused_gemm(x, p, None, FusedConfig(block_k=96))
    with pytest.raises(ValueError, match="split_k 3 must divide the 4 K tiles"):
        nvfp4_fused_gemm(x, p, None, FusedConfig(split_k=3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiles_decode_every_code_and_scale_exactly(device, dtype):
    """The decode GEMMs' weight tiles (two codes per integer operation, the block scale as one multiply) hold
    exactly the dequantized weight: with identity activations each output is one weight times the global scale,
    one float32 rounding as in the reference, so the two are equal bit for bit — every E2M1 code, every
    non-negative E4M3 scale (subnormals and zero included), both signs."""
    from anyfp4.dispatch.configs import FusedConfig
    from anyfp4.kernels.triton.nvfp4_decode import nvfp4_fused_gemm

    n, k = 40, 272
    gen = torch.Generator().manual_seed(11)
    w = random_weight(n, k, gen, device)
    scales = torch.arange(n * k // 16, dtype=torch.int64) % 0x7F  # 0x00 .. 0x7E: every non-negative scale
    w = NVFP4Weight(w.packed, scales.to(torch.uint8).view(n, k // 16).view(torch.float8_e4m3fn).to(device),
                    w.global_scale)
    eye = torch.eye(k, dtype=dtype, device=device)
    out = torch.full((k, n), float("nan"), dtype=dtype, device=device)
    for swap in (False, True):
        y = nvfp4_fused_gemm(eye, prepack_nvfp4(w), None, FusedConfig(block_m=16, block_n=32, block_k=128, num_warps=4,
                                                                      num_stages=1, swap_ab=swap), out=out)
        assert torch.equal(y.t(), dequantize_nvfp4(w).to(dtype))
        out.fill_(float("nan"))
    for m in (1, 16):  # the small-M decode GEMM: its rows of the identity
        got = nvfp4_decode_gemm(eye[:m].contiguous(), prepack_nvfp4(w), None, DecodeConfig(32, 128, 1))
        assert torch.equal(got.t(), dequantize_nvfp4(w).to(dtype)[:, :m])
