import hashlib

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.cli import main
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from helpers import TINY_LLAMA, edit_json, padded_steps, write_float_checkpoint, write_runnable_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    src = write_float_checkpoint(root / "src", dict(TINY_LLAMA, num_hidden_layers=2))
    ckpt = quantize_checkpoint(src, root / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    m, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    return m


def sha(tokens):
    return hashlib.sha256(repr(tokens).encode()).hexdigest()


def test_greedy_is_deterministic(model):
    params = SamplingParams(max_new_tokens=24)
    runs = {sha(generate(model, [[5, 6, 7, 8]], params)) for _ in range(3)}
    assert len(runs) == 1


def test_decode_steps_match_a_full_forward(model):
    prompt = [3, 9, 27, 81, 17]
    out = generate(model, [prompt], SamplingParams(max_new_tokens=12))[0]
    seq = prompt + out
    model.setup_caches(1, len(seq))
    with torch.no_grad():
        logits = model(torch.tensor([seq]), torch.arange(len(seq)))
    # each generated token is the argmax of the full forward's logits at the previous position
    assert logits[0, len(prompt) - 1:-1].argmax(-1).tolist() == out


def test_left_padded_batch_equals_single_runs(model):
    prompts = [[1, 2, 3, 4, 5, 6, 7], [11, 12, 13], [42]]
    params = SamplingParams(max_new_tokens=10)
    batch = generate(model, prompts, params)
    assert batch == [generate(model, [p], params)[0] for p in prompts]


def test_a_prefill_reads_its_visible_slots_from_the_device_once(model, monkeypatch):
    """A prompt longer than a decode step reads where its keys start and end from the device once per forward (each
    read waits for the GPU), not once per attention layer; the values are the batch's own."""
    from anyfp4.runtime import model as model_module

    spans = []

    def counted(*args):
        spans.append(real(*args))
        return spans[-1]

    real = model_module.visible_span
    monkeypatch.setattr(model_module, "visible_span", counted)
    prompts = [[7] * 40, [3] * 36]
    from anyfp4.runtime.generate import left_padded

    model.setup_caches(2, 48)
    tokens, valid, rope, _ = left_padded(prompts, 48, model.device)
    with torch.no_grad():
        model(tokens, torch.arange(40), rope, valid, last=True)
    assert len(model.blocks) == 2 and spans == [(0, 40, [0, 4])]


@pytest.mark.skipif(__import__("anyfp4.kernels.cpu.linear", fromlist=["library"]).library() is None,
                    reason="no C compiler builds the CPU kernels (torch's GEMM then sums a row by the row count)")
def test_a_padded_row_is_computed_as_alone(model):
    """Prompts longer and shorter than a decode step's row limit (the prefill's two attention paths), left-padded
    in one batch: every row's logits and final hidden state after the prompt and at each step equal the prompt's
    alone, bit for bit (the head is a dense layer here: on the CPU the C kernels' dense rows, whose sums do not
    change order with the row count as torch's float32 GEMM's do)."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (70, 40, 9, 3)]
    batch = padded_steps(model, prompts, 6)
    for i, p in enumerate(prompts):
        assert torch.equal(batch[i], padded_steps(model, [p], 6)[0]), len(p)


@pytest.mark.skipif(__import__("anyfp4.kernels.cpu.linear", fromlist=["library"]).library() is None,
                    reason="no C compiler builds the CPU kernels (torch's GEMM then sums a row by the row count)")
def test_a_padded_row_of_a_hybrid_is_computed_as_alone(tmp_path):
    """A Qwen3.5 hybrid (mixed: NVFP4 MLPs, FP8 attention and Gated DeltaNet projections, float a / b projections),
    prompts of 70, 40, 9 and 3 tokens left-padded in one batch: each row's logits and final hidden state after the
    prompt and at each step equal the prompt's alone, bit for bit — the delta rule of a padded row runs from its own
    first token (token by token or in chunks, by its own length), the a / b projections take the C kernels' rows in
    the prompt too."""
    from helpers import save_random_qwen3_5, tiny_qwen3_5_config

    src = save_random_qwen3_5(tmp_path / "src", tiny_qwen3_5_config(128, max_position_embeddings=256))
    ckpt = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    hybrid, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (70, 40, 9, 3)]
    batch = padded_steps(hybrid, prompts, 4)
    assert torch.isfinite(batch).all()
    for i, p in enumerate(prompts):
        assert torch.equal(batch[i], padded_steps(hybrid, [p], 4)[0]), len(p)


def test_stop_tokens_end_generation(model):
    first = generate(model, [[5, 6, 7, 8]], SamplingParams(max_new_tokens=8))[0]
    stop = first[3]
    out = generate(model, [[5, 6, 7, 8]], SamplingParams(max_new_tokens=8, stop_token_ids=(stop,)))[0]
    assert out == first[: first.index(stop) + 1]


def test_steps_launched_ahead_give_the_same_tokens_and_calls(model, monkeypatch):
    """With each step launched before the previous step's tokens are read (what a GPU does), the tokens, the
    calls of on_tokens, stop tokens and sampling are those of the plain order; a stop leaves one step computed in
    vain, and the step count stays within the cache."""
    import anyfp4.runtime.generate as generation

    prompts = [[1, 2, 3, 4, 5, 6, 7], [11, 12, 13]]
    first = generate(model, prompts[:1], SamplingParams(max_new_tokens=8))[0]
    cases = [SamplingParams(max_new_tokens=9), SamplingParams(max_new_tokens=1),
             SamplingParams(max_new_tokens=8, stop_token_ids=(first[2],)),
             SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, seed=3)]
    plain = []
    for params in cases:
        heard = []
        plain.append((generate(model, prompts, params, on_tokens=heard.append), heard))
    monkeypatch.setattr(generation, "launches_ahead", lambda device: True)
    for params, want in zip(cases, plain):
        heard = []
        assert (generate(model, prompts, params, on_tokens=heard.append), heard) == want
    forward, slots = model.forward, []
    monkeypatch.setattr(model, "forward", lambda tokens, input_pos, *a, **k: (
        slots.append(input_pos.tolist()), forward(tokens, input_pos, *a, **k))[1])
    generate(model, prompts, cases[0])
    assert slots == [list(range(7))] + [[7 + i] for i in range(8)]  # the prefill, then a slot per step


def test_sampling_is_seeded(model):
    p = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    a, b = generate(model, [[1, 2, 3]], p), generate(model, [[1, 2, 3]], p)
    assert a == b
    greedy = generate(model, [[1, 2, 3]], SamplingParams(max_new_tokens=16))
    assert generate(model, [[1, 2, 3]], SamplingParams(max_new_tokens=16, temperature=0.7, top_k=1, seed=1)) == greedy


def test_prompt_longer_than_context_is_a_clear_error(model):
    with pytest.raises(ValueError, match="exceeds the model's context of 256 tokens"):
        generate(model, [list(range(250))], SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[]], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_unsupported_architecture_and_mismatch(tmp_path, capsys):
    src = write_float_checkpoint(tmp_path / "gpt", dict(TINY_LLAMA, model_type="gpt2", architectures=["GPT2LMHeadModel"]))
    assert main(["generate", str(src), "--prompt", "hi", "--quiet"]) == 2
    assert "model_type 'gpt2'" in capsys.readouterr().err
    bad = write_float_checkpoint(tmp_path / "mismatch")
    edit_json(bad / "config.json", lambda c: c.update(intermediate_size=128))
    with pytest.raises(Exception, match="config.json implies 128 x 64: checkpoint and config do not match"):
        load_model(bad, "cpu", torch.float32, progress=False)


def test_out_of_memory_at_load_is_a_clear_message(tmp_path, monkeypatch, capsys):
    from anyfp4.runtime import loader

    src = write_runnable_checkpoint(tmp_path / "src")

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(loader, "build_model", no_memory)
    # out of memory is a run-time failure (exit code 1), after every check of the input has passed
    assert main(["generate", str(src), "--prompt", "hi", "--max-tokens", "8", "--quiet", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "out of GPU memory while loading" in err and "GiB on disk" in err and err.count("\n") == 1


@pytest.mark.slow
def test_compiled_decode_steps_give_the_same_tokens(model):
    params = SamplingParams(max_new_tokens=6)
    eager = generate(model, [[5, 6, 7, 8]], params)
    assert generate(model, [[5, 6, 7, 8]], params, compile_decode=True) == eager


def test_cache_slots_round_up_to_blocks_on_cuda_only():
    """On CUDA a generation's cache is whole blocks (a similar generation reuses it and its graphs), at most the
    context; on the CPU it is what the generation needs (attention there reads the whole cache)."""
    from types import SimpleNamespace

    from anyfp4.runtime.generate import CACHE_SLOT_BLOCK, MAX_DRAFT_TOKENS, cache_slots

    def model(device, context=4096):
        return SimpleNamespace(device=torch.device(device), args=SimpleNamespace(max_position_embeddings=context))

    need = 100 + 20 + MAX_DRAFT_TOKENS + 1
    assert cache_slots(model("cpu"), 100, 20) == need
    assert cache_slots(model("cuda"), 100, 20) == CACHE_SLOT_BLOCK
    assert cache_slots(model("cuda"), CACHE_SLOT_BLOCK, 1) == 2 * CACHE_SLOT_BLOCK
    assert cache_slots(model("cuda", context=300), 200, 50) == 300
    assert cache_slots(model("cpu", context=120), 100, 10) == 120
