"""The CUDA-graph decode step replays exactly what the eager step computes (GPU only)."""

import pytest
import torch

from anyfp4.runtime.generate import SamplingParams, decode_step, generate
from anyfp4.bench.random_model import random_model
from helpers import graphed_against_eager, prompt_rows

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_graphed_step_matches_eager(fmt):
    model = random_model("smollm2-135m", fmt, torch.device("cuda"), torch.bfloat16, progress=False)
    prompt = torch.randint(0, model.args.vocab_size, (2, 12), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(0))
    step = decode_step(model)
    results = {}
    for name, fn in (("eager", model), ("graph", step)):
        model.setup_caches(2, 32)
        logits = model(prompt, torch.arange(12, device="cuda"))
        outs = []
        for i in range(6):
            nxt = logits[:, -1].argmax(-1)
            logits = fn(nxt[:, None], torch.tensor([12 + i], device="cuda"))
            outs.append(logits.clone())
        results[name] = torch.stack(outs)
    assert torch.equal(results["eager"], results["graph"])


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_early_launches_change_no_bit_of_a_step(fmt, monkeypatch):
    """Norms, rotary + cache write, attention and decode kernels launched early in one graph give the bits of the
    plainly launched eager step."""
    model = random_model("smollm2-135m", fmt, torch.device("cuda"), torch.bfloat16, progress=False)
    eager, graph = graphed_against_eager(model, monkeypatch)
    assert torch.isfinite(eager).all() and eager.abs().amax() > 0
    assert torch.equal(eager, graph)


@gpu
def test_generate_with_graphs_matches_eager_generate(monkeypatch):
    import anyfp4.runtime.generate as gen_mod

    model = random_model("smollm2-135m", "nvfp4", torch.device("cuda"), torch.bfloat16, progress=False)
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]  # left padding: rope positions and key masks go through the graph
    graphed = generate(model, prompts, params)
    monkeypatch.setattr(gen_mod, "decode_step", lambda m, compile_decode=False: m)
    assert generate(model, prompts, params) == graphed


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_a_left_padded_batch_gives_each_prompts_text_alone(fmt, monkeypatch):
    """What a batched server relies on: greedy texts of a padded batch, prefill and graphed decode, as alone —
    with the prefill whose rows do not depend on how many share a call (``ANYFP4_PREFILL=chunked``; the default
    cuBLAS prefill picks its kernel by M, and on the H200 this test's NVFP4 batch then gave other texts)."""
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    model = random_model("smollm2-135m", fmt, torch.device("cuda"), torch.bfloat16, progress=False)
    params = SamplingParams(max_new_tokens=24)
    gen = torch.Generator().manual_seed(3)
    # padding of more than one 64-key chunk and segment, prompts on both prefill attention paths (> and <= 32)
    prompts = [torch.randint(0, model.args.vocab_size, (n,), generator=gen).tolist() for n in (150, 40, 9, 83, 1)]
    assert generate(model, prompts, params) == [generate(model, [p], params)[0] for p in prompts]


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_prompt_rows_in_graphed_steps_are_computed_as_alone(fmt, monkeypatch):
    """``ANYFP4_PREFILL=chunked``'s prompt (``runtime.prompt``): a left-padded batch of five in graphed steps of
    6 tokens per row gives each row the last logits and final-norm outputs of its prompt alone in steps of 32, bit
    for bit, and the graphed steps give the bits of the same steps run eagerly."""
    from anyfp4.runtime.prompt import prompt_step_tokens

    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    model = random_model("smollm2-135m", fmt, torch.device("cuda"), torch.bfloat16, progress=False)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, model.args.vocab_size, (n,), generator=gen).tolist() for n in (150, 40, 9, 83, 1)]
    steps = prompt_step_tokens(model, len(prompts))
    batch = prompt_rows(model, prompts, decode_step(model), steps)
    assert steps == 6 and all(torch.isfinite(h).all() and h.abs().amax() > 0 for _, h in batch)
    for (logits, hidden), p in zip(batch, prompts):
        ((alone_logits, alone_hidden),) = prompt_rows(model, [p], decode_step(model), prompt_step_tokens(model, 1))
        assert torch.equal(logits, alone_logits) and torch.equal(hidden, alone_hidden), len(p)
    eager = prompt_rows(model, prompts, model, steps)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batch, eager))


@gpu
def test_speculative_verify_graphs_give_the_plain_greedy_text():
    from anyfp4.runtime.speculative import generate_speculative

    model = random_model("smollm2-135m", "nvfp4", torch.device("cuda"), torch.bfloat16, progress=False)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7] * 4
    params = SamplingParams(max_new_tokens=64)
    plain = generate(model, [prompt], params)[0]
    for k in range(1, 8):  # verify passes of M = 2 .. 8 rows, each a captured graph
        spec, stats = generate_speculative(model, prompt, params, k)
        assert spec == plain and stats.verify_steps >= 1


@gpu
@pytest.mark.parametrize("pack", ["0", "1"])
def test_speculation_refuses_the_triton_kernels(monkeypatch, pack):
    """The Triton decode path picks its kernel and split by M, so a verify pass's rows would not get a one-token
    step's bits and the greedy text could leave plain decoding's (seen on an H200, 2026-12-01): on this GPU with
    ``ANYFP4_KERNELS=triton`` speculation refuses before its first token, naming what it needs, with the
    activation block-pack off and on."""
    from anyfp4.runtime.speculative import generate_speculative

    model = random_model("smollm2-135m", "nvfp4", torch.device("cuda"), torch.bfloat16, progress=False)
    monkeypatch.setenv("ANYFP4_KERNELS", "triton")
    monkeypatch.setenv("ANYFP4_ACT_PACK", pack)
    heard = []
    with pytest.raises(NotImplementedError, match=r"sm_\d+ with bfloat16 .* needs the CUDA decode kernels"):
        generate_speculative(model, [5, 6, 7, 8] * 8, SamplingParams(max_new_tokens=16), 4, on_tokens=heard.append)
    assert heard == []


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_a_verify_pass_gives_the_bits_of_decode_steps(fmt):
    """Speculation's greedy text equals plain decoding's only if a row of an M-row pass is computed exactly
    as a one-row step: the logits of one 6-row pass equal those of 6 single-token steps, bit for bit,
    with caches of different lengths (as generate and generate_speculative allocate)."""
    model = random_model("smollm2-135m", fmt, torch.device("cuda"), torch.bfloat16, progress=False)
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, model.args.vocab_size, (1, 40), device="cuda", generator=gen)
    new = torch.randint(0, model.args.vocab_size, (1, 6), device="cuda", generator=gen)
    step = decode_step(model)
    model.setup_caches(1, 64)
    model(prompt, torch.arange(40, device="cuda"))
    singles = torch.cat([step(new[:, i:i + 1], torch.tensor([40 + i], device="cuda")).clone() for i in range(6)], 1)
    model.setup_caches(1, 80)
    model(prompt, torch.arange(40, device="cuda"))
    verify = step(new, torch.arange(40, 46, device="cuda"))
    assert torch.equal(verify, singles)


def _step_logits(model, prompts, steps):
    """The logits of ``steps`` eager greedy decode steps after a left-padded prefill of ``prompts``, laid out as
    ``generate`` lays them out (its cache slots): (steps, b, vocab)."""
    from anyfp4.runtime.generate import cache_slots, left_padded

    longest = max(len(p) for p in prompts)
    slots = cache_slots(model, longest, steps)
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, model.device)
    logits = model(tokens, torch.arange(longest, device="cuda"), rope if padded else None,
                   valid if padded else None, last=True)
    out = []
    for step in range(steps):
        valid[:, longest + step] = True
        logits = model(logits[:, -1].argmax(-1)[:, None], torch.tensor([longest + step], device="cuda"),
                       rope[:, -1:] + 1 + step if padded else None, valid if padded else None)
        out.append(logits[:, -1].clone())
    return torch.stack(out)


@gpu
def test_llama_shaped_padded_rows_decode_as_alone(monkeypatch):
    """Llama-3.1-8B's layers (32 query heads over 8 KV heads of 128; two of them) in caches of 256 slots, as
    generate allocates them: every decode step's logits of each row of a left-padded batch, the unpadded longest
    row too, equal the prompt's alone bit for bit (where a call without a first slot compiled another attention
    kernel, the H200 gave most rows other bits at the first step)."""
    from anyfp4.bench.random_model import ARCHS, RandomSource
    from anyfp4.runtime.config import ModelArgs
    from anyfp4.runtime.loader import build_model

    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    args = ModelArgs(**{**ARCHS["llama-3.1-8b"], "num_layers": 2, "vocab_size": 4096})
    model = build_model(args, RandomSource("nvfp4", "cuda"), torch.device("cuda"), torch.bfloat16, progress=False)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 4096, (n,), generator=gen).tolist() for n in (45, 20, 66, 9)]
    batch = _step_logits(model, prompts, 4)
    assert torch.isfinite(batch).all()
    for i, p in enumerate(prompts):
        assert torch.equal(batch[:, i], _step_logits(model, [p], 4)[:, 0]), i
