"""A Qwen3.5 hybrid on a GPU (GPU only): the CUDA-graph step replays the eager step with its Gated DeltaNet states,
a verify pass gives the bits of single steps, a left-padded batch decodes what each prompt decodes alone, and
speculation (n-gram and the MTP head) keeps plain decoding's greedy text."""

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.generate import SamplingParams, decode_step, generate
from helpers import graphed_against_eager, save_random_qwen3_5, tiny_qwen3_5_config, with_random_mtp_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module", params=["mixed", "nvfp4", "bf16"])
def hybrid(request, tmp_path_factory):
    """A tiny random Qwen3.5 hybrid with a random MTP head, in ``request.param``, on the GPU in bf16."""
    from anyfp4.runtime.loader import load_mtp, load_planned
    from anyfp4.runtime.plan import plan_checkpoint, plan_mtp

    root = tmp_path_factory.mktemp(f"gpu_hybrid_{request.param}")
    config = tiny_qwen3_5_config(max_position_embeddings=512)
    save_random_qwen3_5(root / "src", config)
    with_random_mtp_head(root / "src", config)
    ckpt = root / "src"
    if request.param != "bf16":
        fmt = TargetFormat.MIXED if request.param == "mixed" else TargetFormat.NVFP4
        ckpt = quantize_checkpoint(ckpt, root / "q", QuantizeOptions(format=fmt, progress=False)).dst
    plan = plan_checkpoint(ckpt)
    return load_planned(plan, CUDA, torch.bfloat16, progress=False), load_mtp(plan_mtp(plan), CUDA, torch.bfloat16)


def test_graphed_step_matches_eager(hybrid):
    model, _ = hybrid
    prompt = torch.randint(0, model.args.vocab_size, (2, 12), device=CUDA,
                           generator=torch.Generator(device=CUDA).manual_seed(0))
    step = decode_step(model)
    results = {}
    for name, fn in (("eager", model), ("graph", step)):
        model.setup_caches(2, 32)
        logits = model(prompt, torch.arange(12, device=CUDA))
        outs = []
        for i in range(6):
            nxt = logits[:, -1].argmax(-1)
            logits = fn(nxt[:, None], torch.tensor([12 + i], device=CUDA))
            outs.append(logits.clone())
        results[name] = torch.stack(outs)
    assert torch.equal(results["eager"], results["graph"])


def test_early_launches_change_no_bit_of_a_step(hybrid, monkeypatch):
    """The Gated DeltaNet kernels launched early too: a graph captured with early launches gives the bits of the
    plainly launched eager step."""
    eager, graph = graphed_against_eager(hybrid[0], monkeypatch)
    assert torch.isfinite(eager).all() and eager.abs().amax() > 0
    assert torch.equal(eager, graph)


def test_b_a_in_the_convolutions_launch_change_no_bit(hybrid, monkeypatch):
    """The float b / a projections computed in the convolution's launch (ops.causal_conv_proj) give the logits of
    their own GEMV launch, step after step."""
    from anyfp4.runtime.gated_deltanet import GatedDeltaNet

    model, _ = hybrid
    mixers = [m for m in model.modules() if isinstance(m, GatedDeltaNet)]
    one_row = torch.zeros(1, 1, model.args.hidden_size, device=CUDA, dtype=torch.bfloat16)
    assert mixers and all(m.b_a_in_conv(one_row) for m in mixers)  # the checkpoint's b / a stay bf16
    prompt = torch.randint(0, model.args.vocab_size, (2, 12), device=CUDA,
                           generator=torch.Generator(device=CUDA).manual_seed(3))
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(GatedDeltaNet, "b_a_in_conv", lambda self, x: False)
        model.setup_caches(2, 32)
        logits = model(prompt, torch.arange(12, device=CUDA))
        outs = [logits[:, -1].clone()]
        for i in range(4):
            logits = model(outs[-1].argmax(-1)[:, None], torch.tensor([12 + i], device=CUDA))
            outs.append(logits[:, -1].clone())
        results.append(torch.stack(outs))
    assert torch.isfinite(results[0]).all() and torch.equal(results[0], results[1])


def test_a_verify_pass_gives_the_bits_of_decode_steps(hybrid):
    """Speculation's greedy text holds only if a row of a 6-row pass is computed as a one-row step is."""
    model, _ = hybrid
    gen = torch.Generator(device=CUDA).manual_seed(1)
    prompt = torch.randint(0, model.args.vocab_size, (1, 40), device=CUDA, generator=gen)
    new = torch.randint(0, model.args.vocab_size, (1, 6), device=CUDA, generator=gen)
    step = decode_step(model)
    model.setup_caches(1, 64)
    model(prompt, torch.arange(40, device=CUDA))
    singles = torch.cat([step(new[:, i:i + 1], torch.tensor([40 + i], device=CUDA)).clone() for i in range(6)], 1)
    model.setup_caches(1, 80)
    model(prompt, torch.arange(40, device=CUDA))
    verify = step(new, torch.arange(40, 46, device=CUDA))
    assert torch.equal(verify, singles)


def test_a_left_padded_batch_equals_single_runs(hybrid):
    model, _ = hybrid
    prompts = [[1, 2, 3, 4, 5, 6, 7], [11, 12, 13], [42]]
    params = SamplingParams(max_new_tokens=12)
    assert generate(model, prompts, params) == [generate(model, [p], params)[0] for p in prompts]


@pytest.mark.parametrize("gdn_prefill", ["torch", "recurrent", "chunked"])
def test_padded_rows_of_long_prompts_are_computed_as_alone(hybrid, gdn_prefill, monkeypatch):
    """With ``ANYFP4_PREFILL=chunked`` (prompts' quantized and small float layers as decode steps compute them), in
    every Gated DeltaNet prefill mode: prompts of 70, 40, 9 and 3 tokens left-padded in one batch give each row's
    logits and final hidden state, after the prompt and at each step, bit for bit as the prompt alone."""
    from anyfp4.nn.linear import NVFP4Linear
    from helpers import padded_steps

    model, _ = hybrid
    if not any(isinstance(m, NVFP4Linear) for m in model.modules()):  # the bf16 model
        pytest.skip("float layers of many outputs run cuBLAS in a prompt, whose kernel depends on the row count")
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    monkeypatch.setenv("ANYFP4_GDN_PREFILL", gdn_prefill)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, model.args.vocab_size, (n,), generator=gen).tolist() for n in (70, 40, 9, 3)]
    batch = padded_steps(model, prompts, 3)
    assert torch.isfinite(batch).all()
    for i, p in enumerate(prompts):
        assert torch.equal(batch[i], padded_steps(model, [p], 3)[0]), (len(p), gdn_prefill)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_speculation_keeps_the_greedy_text(hybrid, k):
    from anyfp4.runtime.speculative import generate_speculative

    model, head = hybrid
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5] * 2
    params = SamplingParams(max_new_tokens=40)
    plain = generate(model, [prompt], params)[0]
    ngram, _ = generate_speculative(model, prompt, params, k)
    mtp, stats = generate_speculative(model, prompt, params, k, mtp=head)
    assert ngram == plain and mtp == plain and stats.verify_steps >= 1


def test_the_graphed_mtp_head_replays_the_eager_head(hybrid):
    """The head's graphed steps (one and four tokens, chained on their own outputs) give the eager head's bits."""
    from anyfp4.runtime.cuda_graph import GraphedHeadStep

    model, head = hybrid
    gen = torch.Generator(device=CUDA).manual_seed(3)
    prompt = torch.randint(0, model.args.vocab_size, (1, 12), device=CUDA, generator=gen)
    model.setup_caches(1, 32)
    _, hidden = model(prompt, torch.arange(12, device=CUDA), hidden=True)
    graphed = GraphedHeadStep(head, model)
    results = {}
    for name, fn in (("eager", lambda *a: head(model, *a)), ("graph", graphed)):
        head.setup_caches(1, 32, model)
        outs = []
        logits, out = fn(prompt[:, 1:5], hidden[:, :4], torch.arange(4, device=CUDA))
        outs.append(logits.clone())
        for i in range(4):
            tok = logits[:, -1:].argmax(-1)
            logits, out = fn(tok, out[:, -1:], torch.tensor([4 + i], device=CUDA))
            outs.append(logits.clone())
        results[name] = torch.cat(outs, 1)
    assert torch.equal(results["eager"], results["graph"])


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_the_gdn_prefill_modes_agree(hybrid, mode, monkeypatch):
    """A 100-token prompt (chunks of 64 and of 36) prefilled by the step kernels or the chunked kernels gives the
    pure-torch form's logits to bf16 rounding, and the same decode step after it."""
    model, _ = hybrid
    prompt = torch.randint(0, model.args.vocab_size, (2, 100), device=CUDA,
                           generator=torch.Generator(device=CUDA).manual_seed(2))
    results = {}
    for name in ("torch", mode):
        monkeypatch.setenv("ANYFP4_GDN_PREFILL", name)
        model.setup_caches(2, 128)
        logits = model(prompt, torch.arange(100, device=CUDA)).float()
        step = model(logits[:, -1].argmax(-1)[:, None], torch.tensor([100], device=CUDA)).float()
        results[name] = logits, step
    (want, want_step), (got, got_step) = results["torch"], results[mode]
    assert torch.isfinite(got).all() and ((got - want).norm() / want.norm()).item() < 2e-2
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9
    assert ((got_step - want_step).norm() / want_step.norm()).item() < 2e-2
