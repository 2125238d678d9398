import pytest
import torch

from anyfp4.formats.nvfp4 import NVFP4Weight, quantize_nvfp4
from anyfp4.kernels.nvfp4_prepack import (
    K_ALIGN,
    ROW_ALIGN,
    prepack_nvfp4,
    prepack_nvfp4_gated,
    unprepack_nvfp4,
    unprepack_nvfp4_gated,
)


def random_weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                       torch.randint(0, 0x7E, (n, k // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn),
                       torch.tensor(0.01))


@pytest.mark.parametrize("n, k", [(64, 256), (4120, 1552), (1, 16), (130, 272)])
def test_round_trip_and_padding(n, k):
    w = random_weight(n, k)
    p = prepack_nvfp4(w)
    assert p.codes.dtype == torch.int32 and p.codes.shape[0] % ROW_ALIGN == 0 and (p.codes.shape[1] * 8) % K_ALIGN == 0
    assert p.scales.shape == (p.codes.shape[0], p.codes.shape[1] // 2)
    back = unprepack_nvfp4(p)
    assert torch.equal(back.packed, w.packed)
    assert torch.equal(back.block_scale.view(torch.uint8), w.block_scale.view(torch.uint8))
    assert torch.equal(back.global_scale, w.global_scale)
    # padding is zero codes and zero scales
    raw = p.codes.view(torch.uint8)
    assert not raw[n:].any() and not raw[:, k // 2:].any() and not p.scales[n:].any()


def test_word_layout_is_checkpoint_order():
    codes = torch.arange(16, dtype=torch.uint8).repeat(1, 1)  # k = 0..15 hold codes 0..15
    from anyfp4.formats.nvfp4 import pack_nibbles

    w = NVFP4Weight(pack_nibbles(codes), torch.ones(1, 1).to(torch.float8_e4m3fn), torch.tensor(1.0))
    word = prepack_nvfp4(w).codes[0, 0].item() & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == list(range(8))


def test_gated_round_trip():
    gate, up = random_weight(130, 64, 1), random_weight(130, 64, 2)
    p = prepack_nvfp4_gated(gate, up)
    assert p.gated and p.up_offset % ROW_ALIGN == 0 and p.out_features == 130
    g, u = unprepack_nvfp4_gated(p)
    assert torch.equal(g.packed, gate.packed) and torch.equal(u.packed, up.packed)


def test_gated_needs_shared_scale():
    a = quantize_nvfp4(torch.randn(16, 32))
    b = quantize_nvfp4(torch.randn(16, 32) * 3)
    with pytest.raises(ValueError, match="share one global scale"):
        prepack_nvfp4_gated(a, b)
