"""The rotary-embedding + KV-cache-write kernel against its pure-torch definition (Triton's interpreter
on the CPU, the kernel on a GPU): q/k/v as views of one fused projection output, rope tables shared or
per sequence, full and partial rotary (the tables narrower than a head: the rest passes through), NaN-poisoned
output and caches (slots not written must keep their NaNs); with q / k RMSNorm weights (Qwen3's per-head norms) in the
same launch, the bits of ``rms_norm`` then the rotation."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4)
from anyfp4.kernels.glue.reference import rope_cache_reference
from anyfp4.kernels.glue.rms_norm import rms_norm_triton
from anyfp4.kernels.glue.rope_cache import rope_cache


def tables(b, t, rd, start, device, per_sequence):
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    pos = torch.arange(start, start + t, dtype=torch.float32)[None].repeat(b if per_sequence else 1, 1)
    if per_sequence:
        pos = pos - torch.arange(b, dtype=torch.float32)[:, None]  # left padding shifts a row's positions
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,t,h,kvh,hd,rd,per_sequence", [(1, 1, 4, 2, 64, 64, False), (2, 5, 3, 1, 48, 48, True),
                                                          (1, 9, 2, 2, 128, 128, False), (1, 1, 4, 1, 256, 64, False),
                                                          (2, 3, 2, 1, 80, 32, True)])
def test_matches_reference(device, dtype, b, t, h, kvh, hd, rd, per_sequence):
    gen = torch.Generator().manual_seed(b * 100 + t * 10 + hd + rd)
    fused = torch.randn(b, t, (h + 2 * kvh) * hd, generator=gen).to(device=device, dtype=dtype)
    q, k, v = fused.split([h * hd, kvh * hd, kvh * hd], dim=-1)
    q, k, v = q.view(b, t, h, hd), k.view(b, t, kvh, hd), v.view(b, t, kvh, hd)
    cos, sin = tables(b, t, rd, 7, device, per_sequence)
    pos = torch.arange(7, 7 + t, device=device)
    caches = [torch.full((b, kvh, 20, hd), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    q_out = torch.full((b, t, h, hd), float("nan"), dtype=dtype, device=device)
    got = rope_cache(q, k, v, cos, sin, caches[0], caches[1], pos, q_out=q_out)
    want = rope_cache_reference(q, k, v, cos, sin, caches[2], caches[3], pos)
    assert got.data_ptr() == q_out.data_ptr() and not got.isnan().any()
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    assert torch.equal(got[..., rd:], q[..., rd:]) and not torch.equal(got[..., :rd], q[..., :rd])
    assert torch.equal(caches[0][:, :, 7:7 + t, rd:], k[..., rd:].transpose(1, 2))
    for ours, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        written = ours[:, :, 7:7 + t]
        assert not written.isnan().any()
        torch.testing.assert_close(written.float(), ref[:, :, 7:7 + t].float(), **tol)
        assert ours[:, :, :7].isnan().all() and ours[:, :, 7 + t:].isnan().all()


def test_the_op_refuses_half_precision_tables(device):
    q = torch.zeros(1, 1, 2, 16, dtype=torch.float16, device=device)
    k = v = torch.zeros(1, 1, 1, 16, dtype=torch.float16, device=device)
    cache = torch.zeros(1, 1, 4, 16, dtype=torch.float16, device=device)
    cos = torch.ones(1, 1, 16, dtype=torch.float16, device=device)
    with pytest.raises(TypeError, match="cos and sin must be float32"):
        torch.ops.anyfp4.rope_cache(q, k, v, cos, cos, cache, cache.clone(), torch.zeros(1, dtype=torch.long,
                                                                                          device=device))


def test_the_op_refuses_tables_wider_than_a_head(device):
    q = torch.zeros(1, 1, 2, 16, device=device)
    k = v = torch.zeros(1, 1, 1, 16, device=device)
    cache = torch.zeros(1, 1, 4, 16, device=device)
    cos = torch.ones(1, 1, 18, device=device)
    with pytest.raises(ValueError, match=r"rotary tables \(1, 1, 18\) must be even-wide and at most head_dim 16"):
        torch.ops.anyfp4.rope_cache(q, k, v, cos, cos, cache, cache.clone(), torch.zeros(1, dtype=torch.long,
                                                                                          device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,t,h,kvh,hd,rd", [(1, 1, 4, 2, 64, 64), (2, 3, 3, 1, 48, 48), (1, 2, 2, 1, 256, 64)])
def test_head_norms_in_the_launch_give_the_norm_kernels_bits(device, dtype, b, t, h, kvh, hd, rd):
    """q / k normalized in the rotation's launch (a gated query: q a strided view, as Qwen3.5's query | gate projection
    gives it; q's weight float32, k's of the activations' dtype): the pure-torch definition's values, and the rms_norm
    kernel's output rotated bit for bit."""
    gen = torch.Generator().manual_seed(hd * 10 + t)
    fused = (3 * torch.randn(b, t, (2 * h + 2 * kvh) * hd, generator=gen)).to(device=device, dtype=dtype)
    qg, k, v = fused.split([2 * h * hd, kvh * hd, kvh * hd], dim=-1)
    q = qg.view(b, t, h, 2 * hd)[..., :hd]
    k, v = k.view(b, t, kvh, hd), v.view(b, t, kvh, hd)
    qw, kw = (torch.rand(hd, generator=gen) + 0.5 for _ in range(2))
    qw, kw = qw.to(device), kw.to(device=device, dtype=dtype)  # a float32 (zero-centred, 1 + w) and a dtype weight
    cos, sin = tables(b, t, rd, 3, device, False)
    pos = torch.arange(3, 3 + t, device=device)
    caches = [torch.full((b, kvh, 8, hd), float("nan"), dtype=dtype, device=device) for _ in range(6)]
    q_out = torch.full((b, t, h, hd), float("nan"), dtype=dtype, device=device)
    got = rope_cache(q, k, v, cos, sin, caches[0], caches[1], pos, q_out=q_out, norms=(qw, kw, 1e-6))
    two = rope_cache(rms_norm_triton(q, qw, 1e-6), rms_norm_triton(k, kw, 1e-6), v, cos, sin, caches[2], caches[3], pos)
    want = rope_cache_reference(q, k, v, cos, sin, caches[4], caches[5], pos, (qw, kw, 1e-6))
    assert got.data_ptr() == q_out.data_ptr() and not got.isnan().any()
    for ours, theirs in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert ours[:, :, :3].isnan().all() and ours[:, :, 3 + t:].isnan().all()
        assert not ours[:, :, 3:3 + t].isnan().any()
    assert torch.equal(caches[1][:, :, 3:3 + t], caches[3][:, :, 3:3 + t])  # v as it came
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(caches[0][:, :, 3:3 + t].float(), caches[4][:, :, 3:3 + t].float(), **tol)
    for ours, theirs in ((got, two), (caches[0][:, :, 3:3 + t], caches[2][:, :, 3:3 + t])):
        assert torch.equal(ours, theirs)
    assert not torch.allclose(got.float(), rope_cache_reference(q, k, v, cos, sin, caches[4].clone(),
                                                                caches[5].clone(), pos).float(), **tol)


def test_the_op_with_head_norms(device):
    """The op's norm arguments: both or neither, head_dim wide; the CPU path is the definition."""
    q = torch.randn(1, 2, 2, 16, device=device)
    k, v = torch.randn(1, 2, 1, 16, device=device), torch.randn(1, 2, 1, 16, device=device)
    cache = torch.zeros(1, 1, 4, 16, device=device)
    cos, sin = tables(1, 2, 16, 0, device, False)
    pos = torch.arange(2, device=device)
    w = torch.rand(16, device=device) + 0.5
    with pytest.raises(ValueError, match="give both q_norm and k_norm, or neither"):
        torch.ops.anyfp4.rope_cache(q, k, v, cos, sin, cache, cache.clone(), pos, w)
    with pytest.raises(ValueError, match=r"q_norm \(16,\) and k_norm \(8,\) must both be \(16,\)"):
        torch.ops.anyfp4.rope_cache(q, k, v, cos, sin, cache, cache.clone(), pos, w, w[:8], 1e-6)
    caches = [cache.clone() for _ in range(4)]
    got = torch.ops.anyfp4.rope_cache(q, k, v, cos, sin, caches[0], caches[1], pos, w, 2 * w, 1e-5)
    want = rope_cache_reference(q, k, v, cos, sin, caches[2], caches[3], pos, (w, 2 * w, 1e-5))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(caches[0], caches[2])
