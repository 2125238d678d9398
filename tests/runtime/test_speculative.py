import hashlib

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.runtime.speculative import generate_speculative, ngram_draft
from helpers import TINY_LLAMA, write_float_checkpoint


def test_ngram_draft():
    seq = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert ngram_draft(seq, 2) == [4, 5]  # "1 2 3" occurred before, followed by 4 5
    assert ngram_draft([7, 8, 9], 3) == []  # nothing repeats
    assert ngram_draft([5, 6, 5], 4) == [6, 5]  # unigram fallback, latest occurrence


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    src = write_float_checkpoint(root / "src", dict(TINY_LLAMA, num_hidden_layers=2, max_position_embeddings=512))
    ckpt = quantize_checkpoint(src, root / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    m, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    return m


def sha(tokens):
    return hashlib.sha256(repr(tokens).encode()).hexdigest()


@pytest.mark.parametrize("k", range(1, 8))
def test_same_greedy_text_for_every_k(model, k):
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]  # repetitive: n-gram drafts hit
    params = SamplingParams(max_new_tokens=40)
    plain = generate(model, [prompt], params)[0]
    spec, stats = generate_speculative(model, prompt, params, k)
    assert sha(spec) == sha(plain)
    assert stats.verify_steps >= 1 and stats.drafted >= stats.accepted
    assert stats.verify_steps < len(plain)  # some drafts were accepted or at least proposed


def test_stop_token_and_limits(model):
    prompt = [3, 4, 5, 3, 4, 5]
    plain = generate(model, [prompt], SamplingParams(max_new_tokens=20))[0]
    stop = plain[5]
    params = SamplingParams(max_new_tokens=20, stop_token_ids=(stop,))
    spec, _ = generate_speculative(model, prompt, params, 4)
    assert spec == generate(model, [prompt], params)[0]
    with pytest.raises(ValueError, match="draft_tokens"):
        generate_speculative(model, prompt, SamplingParams(), 17)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_draft_model_gives_the_same_text(model, tmp_path, k):
    # a draft model of the same shape in another format: high acceptance, same greedy text
    src = write_float_checkpoint(tmp_path / "src", dict(TINY_LLAMA, num_hidden_layers=2, max_position_embeddings=512))
    draft, _ = load_model(src, "cpu", torch.float32, progress=False)
    prompt = [3, 4, 5, 6, 7, 3, 4]
    params = SamplingParams(max_new_tokens=30)
    plain = generate(model, [prompt], params)[0]
    spec, stats = generate_speculative(model, prompt, params, k, draft_model=draft)
    assert spec == plain
    assert stats.acceptance_length > 0


def test_draft_model_vocabulary_must_match(model, tmp_path):
    src = write_float_checkpoint(tmp_path / "other", dict(TINY_LLAMA, vocab_size=64))
    draft, _ = load_model(src, "cpu", torch.float32, progress=False)
    with pytest.raises(ValueError, match="vocabulary"):
        generate_speculative(model, [1, 2, 3], SamplingParams(max_new_tokens=4), 2, draft_model=draft)


def test_rejection_rule_keeps_the_target_distribution():
    """A deterministic draft accepted with probability p(x), else a resample from p without x: the
    tokens it yields are distributed as p (20000 draws, every probability within 0.015)."""
    from anyfp4.runtime.speculative import accept_or_resample

    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    for draft in (0, 3, 5):  # likely, unlikely, impossible drafts
        counts = torch.zeros(6)
        accepted = 0
        for _ in range(20000):
            ok, tok = accept_or_resample(p, draft, g)
            counts[tok] += 1
            accepted += ok
        assert (counts / 20000 - p).abs().max() < 0.015, (draft, counts / 20000)
        assert abs(accepted / 20000 - float(p[draft])) < 0.015


def test_sampling_with_speculation_runs_and_is_seeded(model):
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]
    params = SamplingParams(max_new_tokens=30, temperature=0.8, top_k=20, seed=3)
    a, stats = generate_speculative(model, prompt, params, 4)
    b, _ = generate_speculative(model, prompt, params, 4)
    assert a == b and len(a) == 30 and stats.verify_steps >= 1
    assert all(0 <= t < model.args.vocab_size for t in a)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A Qwen3.5 hybrid (Gated DeltaNet layers), NVFP4, on the CPU in float32."""
    import transformers as tf

    root = tmp_path_factory.mktemp("spec_hybrid")
    config = tf.Qwen3_5TextConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512, head_dim=32, linear_num_key_heads=2,
                                  linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                                  max_position_embeddings=512, tie_word_embeddings=False,
                                  architectures=["Qwen3_5ForCausalLM"])
    torch.manual_seed(0)
    tf.Qwen3_5ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(root / "src"))
    ckpt = quantize_checkpoint(root / "src", root / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    m, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    return m


@pytest.mark.parametrize("k", [1, 3, 7])
def test_a_hybrid_speculates_the_same_greedy_text(hybrid, k):
    """Gated DeltaNet states return to each verify step's accepted prefix: the greedy text of plain decoding."""
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]
    params = SamplingParams(max_new_tokens=40)
    plain = generate(hybrid, [prompt], params)[0]
    spec, stats = generate_speculative(hybrid, prompt, params, k)
    assert spec == plain
    assert stats.verify_steps < len(plain) and stats.accepted < stats.drafted  # drafts kept and drafts rejected
