"""A prompt run at once or in steps of a few tokens per row (``runtime.prompt``), on the CPU: the steps' logic, and
what the steps compute against one forward (a row alone and in a batch, bit for bit, on the GPU's graphed steps:
``test_cuda_graph.py``)."""

from types import SimpleNamespace

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime import generate as generate_module
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.runtime.prompt import prompt_step_tokens, step_bounds
from helpers import TINY_LLAMA, prompt_rows, save_random_qwen3_5, tiny_qwen3_5_config, write_float_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt")
    src = write_float_checkpoint(root / "src", dict(TINY_LLAMA, num_hidden_layers=2))
    ckpt = quantize_checkpoint(src, root / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    return load_model(ckpt, "cpu", torch.float32, progress=False)[0]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt_hybrid")
    src = save_random_qwen3_5(root / "src", tiny_qwen3_5_config(128, max_position_embeddings=256))
    ckpt = quantize_checkpoint(src, root / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    return load_model(ckpt, "cpu", torch.float32, progress=False)[0]


@pytest.mark.parametrize("total,step", [(1, 32), (32, 32), (33, 32), (70, 2), (7, 3), (5, 1)])
def test_steps_cover_the_prompt_once_remainder_first(total, step):
    bounds = step_bounds(total, step)
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert 1 <= bounds[0][1] <= step and all(e - s == step for s, e in bounds[1:])


def test_a_prompt_without_tokens_or_steps_is_refused():
    with pytest.raises(ValueError, match="0 tokens"):
        step_bounds(0, 32)
    with pytest.raises(ValueError, match="steps of 0"):
        step_bounds(5, 0)


def test_steps_only_on_a_gpu_with_chunked_prefill(monkeypatch):
    gpu, cpu = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    assert [prompt_step_tokens(gpu, rows) for rows in (1, 5, 16, 32, 40)] == [32, 6, 2, 1, 1]
    assert prompt_step_tokens(cpu, 1) is None
    for mode in ("auto", "cublas", "fused"):
        monkeypatch.setenv("ANYFP4_PREFILL", mode)
        assert prompt_step_tokens(gpu, 1) is None


@pytest.mark.parametrize("which", ["llama", "hybrid"])
def test_a_prompt_in_steps_computes_what_one_forward_computes(which, request):
    """Logits and every position's final-norm output of a left-padded batch run in steps of 1, 3 and 8 tokens per
    row equal one forward's up to float32 rounding (the two sum in other orders: one forward's attention and
    delta rule run in chunks of their own; on the CPU a step's attention rows are not independent of the step's
    positions either — the bits alone and in a batch are the GPU's test): padding positions, whole steps of them
    for the short rows, see no key and leave a hybrid's recurrent state as it was."""
    model = request.getfixturevalue(which)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (45, 9, 30)]
    whole = prompt_rows(model, prompts, model, None)
    for step in (1, 3, 8):
        for (a_logits, a_hidden), (b_logits, b_hidden) in zip(whole, prompt_rows(model, prompts, model, step)):
            assert torch.isfinite(b_hidden).all()
            torch.testing.assert_close(b_logits, a_logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(b_hidden, a_hidden, rtol=1e-4, atol=1e-4)


def test_generate_runs_prompts_in_steps_where_asked(llama, monkeypatch):
    """generate with steps of 32 // rows tokens per row (what a GPU with ``ANYFP4_PREFILL=chunked`` takes) asks for
    them by the batch's rows, and its texts are those of the prompts at once."""
    calls = []

    def steps(model, rows):
        calls.append(rows)
        return 32 // rows

    monkeypatch.setattr(generate_module, "prompt_step_tokens", steps)
    params = SamplingParams(max_new_tokens=8)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (50, 17, 5)]
    batch = generate(llama, prompts, params)
    alone = [generate(llama, [p], params)[0] for p in prompts]
    assert calls == [3, 1, 1, 1]
    monkeypatch.setattr(generate_module, "prompt_step_tokens", lambda model, rows: None)
    assert batch == alone == [generate(llama, [p], params)[0] for p in prompts]
