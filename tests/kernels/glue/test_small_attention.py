"""Decode / verify attention against a float32 pure-torch reference (Triton's interpreter on the CPU, the
kernel on a GPU): grouped-query heads, t = 1..9 new rows, caches longer than the visible part, causal
and left-padding masks (a row that sees nothing gets zeros), NaN-poisoned outputs; and a row's bits do
not depend on how many rows share the call or how long the cache is."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4)

from anyfp4.kernels.glue.small_attention import small_attention, small_attention_reference


def case(device, dtype, b, kvh, g, t, hd, start, cache, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, kvh * g, hd, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)  # strided
    k = torch.randn(b, kvh, cache, hd, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(b, kvh, cache, hd, generator=gen).to(device=device, dtype=dtype)
    pos = torch.arange(start, start + t, device=device)
    mask = torch.arange(cache, device=device)[None, :] <= pos[:, None]
    return q, k, v, mask, pos


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,kvh,g,t,hd,start,cache", [(1, 2, 4, 1, 64, 70, 150), (2, 1, 3, 5, 32, 0, 40),
                                                      (1, 3, 1, 9, 128, 127, 200), (2, 2, 6, 3, 48, 63, 66)])
def test_matches_reference(device, dtype, b, kvh, g, t, hd, start, cache):
    q, k, v, mask, pos = case(device, dtype, b, kvh, g, t, hd, start, cache, seed=t * 31 + hd)
    out = torch.full((b, t, kvh * g, hd), float("nan"), dtype=dtype, device=device)
    y = small_attention(q, k, v, mask, pos, out=out)
    assert y.data_ptr() == out.data_ptr() and not y.isnan().any()
    ref = small_attention_reference(q, k, v, mask)
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


def test_left_padding_mask_and_fully_masked_rows(device):
    q, k, v, mask, pos = case(device, torch.float16, 2, 2, 2, 2, 64, 3, 80, seed=3)
    valid = torch.ones(2, 80, dtype=torch.bool, device=device)
    valid[1, :4] = False  # row 1 of the batch: slots 0..3 are padding, so its position 3 sees nothing
    full = mask[None, None] & valid[:, None, None, :]
    y = small_attention(q, k, v, full, pos)
    ref = small_attention_reference(q, k, v, full)
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
    assert torch.equal(y[1, 0], torch.zeros_like(y[1, 0]))


def test_rows_do_not_depend_on_the_call(device):
    """Position p alone (a decode step) against p as the first of 8 rows (a verify pass) with a longer cache."""
    q, k, v, mask, pos = case(device, torch.bfloat16, 1, 2, 4, 8, 64, 100, 300, seed=11)
    many = small_attention(q, k, v, mask, pos)
    one = small_attention(q[:, :, :1], k[:, :, :200], v[:, :, :200], mask[:1, :200], pos[:1])
    assert torch.equal(one[:, 0], many[:, 0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_output_gate_is_the_gate_torch_applies(device, dtype):
    """A gate in the launch (a strided view, as the model's query | gate split gives it): the ungated output, rounded,
    times sigmoid(gate), rounded, as torch computes them; within a rounding step where the sigmoid's float lands
    near a tie, bit for bit elsewhere; the op refuses a gate of another shape."""
    q, k, v, mask, pos = case(device, dtype, 2, 2, 3, 4, 64, 20, 90, seed=21)
    b, h, t, hd = q.shape
    gen = torch.Generator().manual_seed(22)
    both = (torch.randn(b, t, h, 2 * hd, generator=gen) * 3).to(device, dtype)
    gate = both[..., hd:]  # strided: (query, gate) per head
    out = torch.full((b, t, h, hd), float("nan"), dtype=dtype, device=device)
    got = small_attention(q, k, v, mask, pos, out=out, gate=gate)
    assert got.data_ptr() == out.data_ptr()
    want = small_attention(q, k, v, mask, pos) * torch.sigmoid(gate.float()).to(dtype)
    assert torch.isfinite(got).all() and (got != want).float().mean() < 0.01
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    assert torch.equal(torch.ops.anyfp4.small_attention(q, k, v, mask, pos, None, gate), got)
    with pytest.raises(ValueError, match="gate"):
        small_attention(q, k, v, mask, pos, gate=gate[:, :2])


def test_the_op_refuses_a_non_bool_mask(device):
    q, k, v, mask, pos = case(device, torch.float16, 1, 1, 1, 1, 32, 0, 16, seed=1)
    with pytest.raises(TypeError, match="mask must be bool"):
        torch.ops.anyfp4.small_attention(q, k, v, mask.int(), pos)


def test_a_cache_past_4096_slots_uses_wider_segments(device):
    """5000 slots: segments of 128 keys (40 of them); rows still match the reference and a one-row call."""
    from anyfp4.kernels.glue.small_attention import segment_keys

    assert segment_keys(4096) == 64 and segment_keys(5000) == 128
    q, k, v, mask, pos = case(device, torch.float16, 1, 1, 2, 3, 16, 4700, 5000, seed=5)
    y = small_attention(q, k, v, mask, pos)
    torch.testing.assert_close(y.float(), small_attention_reference(q, k, v, mask), rtol=2e-2, atol=2e-2)
    one = small_attention(q[:, :, 1:2], k, v, mask[1:2], pos[1:2])
    assert torch.equal(one[:, 0], y[:, 1])


@pytest.mark.parametrize("start", [125, 127])
def test_every_row_of_a_pass_is_a_one_row_call(device, start):
    """Each position of a 4-row pass against that position alone, every head, across a segment boundary
    (Qwen3.5-27B's grouping: 6 query heads per KV head of 256): a row sits in the same place of its tile whatever
    the number of rows."""
    q, k, v, mask, pos = case(device, torch.bfloat16, 1, 2, 6, 4, 256, start, 185, seed=start)
    many = small_attention(q, k, v, mask, pos)
    for i in range(4):
        one = small_attention(q[:, :, i:i + 1], k, v, mask[i:i + 1], pos[i:i + 1])
        assert torch.equal(one[:, 0], many[:, i]), i


def test_a_row_reads_no_slot_past_its_position(device):
    """The slots of a verify pass's later rows hold what those rows wrote (a draft's keys and values, even
    non-finite ones): poisoned with NaN and Inf, they leave the first row as a one-row call gives it."""
    q, k, v, mask, pos = case(device, torch.bfloat16, 1, 2, 6, 3, 64, 60, 150, seed=21)
    k[:, :, 61:], v[:, :, 61:] = float("nan"), float("inf")  # the second and third rows' slots, and beyond
    many = small_attention(q, k, v, mask, pos)
    one = small_attention(q[:, :, :1], k, v, mask[:1], pos[:1])
    assert torch.isfinite(one).all() and torch.equal(one[:, 0], many[:, 0])


@pytest.mark.parametrize("pad,t", [(5, 1), (64, 1), (37, 3)])
def test_a_left_padded_row_with_its_start_gets_its_bits_alone(device, pad, t):
    """A sequence behind ``pad`` padding slots (poisoned: no slot before ``key_start`` is read) in a batch beside
    an unpadded one, its cache longer than alone: with its first valid slot as ``key_start``, its segments and
    chunks begin where they begin alone, so every row is bit for bit the prompt's own call."""
    n, cache = 150, 170  # positions n .. n + t - 1 of the prompt alone
    qa, ka, va, mask_a, pos_a = case(device, torch.bfloat16, 1, 2, 4, t, 64, n, cache, seed=pad)
    alone = small_attention(qa, ka, va, mask_a, pos_a)
    big = cache + pad + 30
    k = torch.randn(2, 2, big, 64, dtype=torch.bfloat16).to(device)
    v = torch.randn(2, 2, big, 64, dtype=torch.bfloat16).to(device)
    k[1, :, pad:pad + cache], v[1, :, pad:pad + cache] = ka[0], va[0]
    k[1, :, :pad], v[1, :, :pad] = float("nan"), float("inf")
    q = torch.cat([torch.randn_like(qa), qa]).to(device)
    pos = pos_a + pad
    valid = torch.ones(2, big, dtype=torch.bool, device=device)
    valid[1, :pad] = False
    full = (torch.arange(big, device=device)[None, :] <= pos[:, None])[None, None] & valid[:, None, None, :]
    start = torch.tensor([0, pad], device=device)
    out = torch.full((2, t, 8, 64), float("nan"), dtype=torch.bfloat16, device=device)
    y = small_attention(q, k, v, full, pos, key_start=start, out=out)
    assert torch.equal(y[1], alone[0])
    torch.testing.assert_close(y[:1].float(), small_attention_reference(q[:1], k[:1], v[:1], full[:1]),
                               rtol=2e-2, atol=2e-2)


def test_a_bad_key_start_is_refused(device):
    q, k, v, mask, pos = case(device, torch.float16, 2, 1, 1, 1, 32, 0, 16, seed=1)
    with pytest.raises(ValueError, match="key_start must be"):
        small_attention(q, k, v, mask, pos, key_start=torch.zeros(3, dtype=torch.long, device=device))


@pytest.mark.parametrize("pad,t", [(7, 1), (64, 1), (13, 20)])
def test_rows_of_a_padded_batch_get_their_bits_alone_in_aligned_caches(device, pad, t):
    """Llama-3.1-8B's grouping (8 KV heads of 4 query heads, 128 wide) in caches of 256 slots, alone and in the
    batch, as the runner allocates them: the batch's unpadded row (start 0) and its padded one (start ``pad``)
    each against its prompt alone, a call without a start."""
    n, cache, kvh, g, hd = 120, 256, 8, 4, 128
    rows, alone = [], []
    for i, p in enumerate((0, pad)):
        qa, ka, va, mask_a, pos_a = case(device, torch.bfloat16, 1, kvh, g, t, hd, n - p, cache, seed=pad * 7 + i)
        alone.append(small_attention(qa, ka, va, mask_a, pos_a))
        k, v = torch.full_like(ka, float("nan")), torch.full_like(va, float("inf"))
        k[:, :, p:], v[:, :, p:] = ka[:, :, :cache - p], va[:, :, :cache - p]
        rows.append((qa, k, v))
    q, k, v = (torch.cat(parts) for parts in zip(*rows))
    pos = torch.arange(n, n + t, device=device)
    valid = torch.ones(2, cache, dtype=torch.bool, device=device)
    valid[1, :pad] = False
    full = (torch.arange(cache, device=device)[None, :] <= pos[:, None])[None, None] & valid[:, None, None, :]
    out = torch.full((2, t, kvh * g, hd), float("nan"), dtype=torch.bfloat16, device=device)
    y = small_attention(q, k, v, full, pos, key_start=torch.tensor([0, pad], device=device), out=out)
    assert torch.equal(y[0], alone[0][0]) and torch.equal(y[1], alone[1][0])
