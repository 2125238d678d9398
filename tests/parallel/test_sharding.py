"""What a rank holds: the per-rank architecture, its slices of the weights, its vocabulary rows."""

import pytest
import torch

from anyfp4.bench.random_weights import random_fp8, random_nvfp4
from anyfp4.formats.fp8 import dequantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4
from anyfp4.parallel.sharding import ShardedSource, rank_args, shard_cols, shard_rows, vocab_slice
from anyfp4.runtime.config import ModelArgs
from helpers import TINY_LLAMA

CONFIG = dict(TINY_LLAMA, intermediate_size=128)  # 64 per rank: whole 16-element groups


def test_uneven_splits_are_refused():
    args = ModelArgs.from_hf(dict(CONFIG, num_key_value_heads=1, num_attention_heads=4))
    with pytest.raises(ValueError, match="cannot split this model over 2 ranks: 1 key/value heads"):
        rank_args(args, 2)
    with pytest.raises(ValueError, match="intermediate size 96"):
        rank_args(ModelArgs.from_hf(TINY_LLAMA), 4)


def test_vocab_slices():
    """ceil(vocab / tp) rows per rank, the last rank's slice shorter."""
    assert [vocab_slice(127, r, 2) for r in range(2)] == [(0, 64), (64, 127)]
    assert [vocab_slice(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "fp8_per_channel", "float"])
def test_row_and_column_shards_are_slices_of_the_weight(fmt):
    gen = torch.Generator().manual_seed(5)
    if fmt == "nvfp4":
        w, value = random_nvfp4(32, 64, "cpu", gen), dequantize_nvfp4
    elif fmt == "float":
        w, value = torch.randn(32, 64, generator=gen), lambda t: t
    else:
        w, value = random_fp8(32, 64, "cpu", gen, per_channel=fmt == "fp8_per_channel"), dequantize_fp8
    whole = value(w)
    assert torch.equal(value(shard_rows(w, 8, 24)), whole[8:24])
    assert torch.equal(value(shard_cols(w, 16, 48)), whole[:, 16:48])


class _Whole:
    """A source of whole (out, in) float weights whose entries say where they sit: 1000 * row + column."""

    def __init__(self):
        self.asked = []

    def linear(self, name, out_features, in_features):
        self.asked.append((name, out_features, in_features))
        w = torch.arange(out_features)[:, None] * 1000 + torch.arange(in_features)[None, :]
        return w, None

    def has_linear(self, name):
        return True


def test_sharded_source_slices_what_the_whole_source_returns():
    """Asked with rank 1's shapes of two ranks: column-parallel rows 32..63, row-parallel columns 32..63,
    vocabulary rows 64..126 of a vocabulary-parallel lm_head, anything else whole."""
    inner = _Whole()
    src = ShardedSource(inner, rank=1, tp=2, vocab_parallel=True)
    w, _ = src.linear("model.layers.0.self_attn.q_proj", 32, 64)
    assert inner.asked[-1] == ("model.layers.0.self_attn.q_proj", 64, 64)
    assert torch.equal(w[:, 0], torch.arange(32, 64) * 1000)
    w, _ = src.linear("model.layers.0.mlp.down_proj", 64, 32)
    assert inner.asked[-1] == ("model.layers.0.mlp.down_proj", 64, 64)
    assert torch.equal(w[0], torch.arange(32, 64))
    w, _ = src.linear("lm_head", 127, 64)
    assert w.shape == (63, 64) and w[0, 0] == 64 * 1000
    w, _ = src.linear("model.layers.0.self_attn.other", 8, 8)
    assert w.shape == (8, 8)
