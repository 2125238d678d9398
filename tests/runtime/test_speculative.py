import hashlib

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.runtime.speculative import generate_speculative, ngram_draft
from helpers import TINY_LLAMA, save_random_qwen3_5, tiny_qwen3_5_config, with_random_mtp_head, write_float_checkpoint


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

    root = tmp_path_factory.mktemp("spec_hybrid")
    config = tiny_qwen3_5_config(max_position_embeddings=512)
    save_random_qwen3_5(root / "src", config)
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


@pytest.fixture(scope="module")
def hybrid_with_mtp(tmp_path_factory):

    from anyfp4.runtime.loader import load_mtp, load_planned
    from anyfp4.runtime.plan import plan_checkpoint, plan_mtp

    root = tmp_path_factory.mktemp("spec_mtp")
    config = tiny_qwen3_5_config(max_position_embeddings=512)
    save_random_qwen3_5(root / "src", config)
    with_random_mtp_head(root / "src", config)
    ckpt = quantize_checkpoint(root / "src", root / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    plan = plan_checkpoint(ckpt)
    return load_planned(plan, "cpu", torch.float32, progress=False), load_mtp(plan_mtp(plan), "cpu", torch.float32)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_the_mtp_head_drafts_and_the_greedy_text_stays(hybrid_with_mtp, k):
    """The checkpoint's own MTP head (random weights) as the draft: plain decoding's greedy text, every draft
    verified."""
    model, head = hybrid_with_mtp
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]
    params = SamplingParams(max_new_tokens=30)
    plain = generate(model, [prompt], params)[0]
    spec, stats = generate_speculative(model, prompt, params, k, mtp=head)
    assert spec == plain
    assert stats.drafted >= stats.verify_steps * min(k, 1) and stats.verify_steps <= len(plain)


def test_mtp_drafts_continue_the_heads_own_chain(hybrid_with_mtp):
    """A drafter's k drafts are the head run step by step on its own outputs from the observed position."""
    from anyfp4.runtime.mtp import MTPDrafter

    model, head = hybrid_with_mtp
    prompt = [5, 9, 2, 7, 7, 1]
    model.setup_caches(1, 32)
    with torch.no_grad():
        logits, hidden = model(torch.tensor([prompt]), torch.arange(6), hidden=True)
        nxt = int(logits[0, -1].argmax())
        drafter = MTPDrafter(head, model)
        drafter.start(32)
        drafter.observe(prompt[1:] + [nxt], hidden, 0)
        drafts = drafter.draft(3)
        head.setup_caches(1, 32, model)
        lg, out = head(model, torch.tensor([prompt[1:] + [nxt]]), hidden, torch.arange(6))
        want = [int(lg[0, -1].argmax())]
        for i in range(2):
            lg, out = head(model, torch.tensor([[want[-1]]]), out[:, -1:], torch.tensor([6 + i]))
            want.append(int(lg[0, -1].argmax()))
    assert drafts == want


def test_mtp_needs_the_head(hybrid):
    from anyfp4.checkpoint.errors import CheckpointError
    from anyfp4.runtime.plan import ModelPlan, plan_mtp

    class Reader:
        root, index = "ckpt", type("I", (), {"names": lambda self: ["model.embed_tokens.weight"]})()

    with pytest.raises(CheckpointError, match="needs the checkpoint's multi-token-prediction head"):
        plan_mtp(ModelPlan(Reader(), hybrid.args, {}, {}))


def test_generate_takes_speculate_mtp(tmp_path, capsys):
    """``anyfp4 generate --speculate mtp``: the text of plain greedy decoding and the speculation line; a
    checkpoint without an MTP head is refused before its weights are read; bench reports the head's drafts."""

    from anyfp4.cli import main
    from helpers import write_tokenizer

    config = tiny_qwen3_5_config(64, vocab_size=128, max_position_embeddings=256)
    src = save_random_qwen3_5(tmp_path / "src", config)
    write_tokenizer(src, 128)
    plain_args = ["generate", str(src), "--prompt", "abcabcabc", "--max-tokens", "12", "--device", "cpu", "--quiet"]
    assert main(plain_args + ["--speculate", "mtp"]) != 0
    assert "multi-token-prediction head" in capsys.readouterr().err
    with_random_mtp_head(src, config)
    assert main(plain_args) == 0
    plain = capsys.readouterr().out
    assert main(plain_args + ["--speculate", "mtp", "--draft-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain and "[speculation:" in captured.err
    import json

    assert main(["bench", str(src), "--speculate", "mtp", "--device", "cpu", "--json", "--prompt-len", "32",
                 "--gen-len", "12", "--draft-tokens", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    spec = (spec[0] if isinstance(spec, list) else spec)["speculative"]
    assert spec["drafter"] == "mtp head" and spec["same_text"] and spec["verify_steps"] >= 1


def test_a_captured_step_of_a_hybrid_holds_its_states(hybrid):
    """A CUDA-graph step is valid for the tensors it was captured with: for a hybrid, the Gated DeltaNet states and
    snapshots beside the KV caches; the same snapshots are kept for steps of the same size (no new capture)."""
    from anyfp4.runtime.cuda_graph import GraphedDecodeStep

    hybrid.setup_caches(1, 32)
    hybrid.setup_snapshots(4)
    step = object.__new__(GraphedDecodeStep)  # its bookkeeping alone (capturing needs a GPU)
    step.model = hybrid
    held = step._caches()
    mixers = hybrid.mixers_with_state()
    assert len(mixers) == 3 and all(any(t is m.recurrent_state for t in held) for m in mixers)
    assert all(any(t is m.snap_recurrent for t in held) for m in mixers)
    snaps = [m.snap_recurrent for m in mixers]
    hybrid.setup_caches(1, 32)
    hybrid.setup_snapshots(4)
    assert all(m.snap_recurrent is s for m, s in zip(mixers, snaps))
    hybrid.setup_snapshots(6)
    assert all(m.snap_recurrent is not s for m, s in zip(mixers, snaps))


def test_a_hybrids_left_padded_batch_equals_single_runs(hybrid):
    """Left padding enters neither the Gated DeltaNet convolution nor its recurrent state: each prompt of a
    left-padded batch decodes the tokens it decodes alone."""
    prompts = [[1, 2, 3, 4, 5, 6, 7], [11, 12, 13], [42]]
    params = SamplingParams(max_new_tokens=10)
    assert generate(hybrid, prompts, params) == [generate(hybrid, [p], params)[0] for p in prompts]
