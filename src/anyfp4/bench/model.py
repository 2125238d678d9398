"""``anyfp4 bench``: prefill and decode speed of a model, and the bandwidth its decode achieves."""

from __future__ import annotations

import hashlib
import statistics
import time
from functools import partial

import torch

from ..nn.linear import DenseLinear, FP8Linear, NVFP4Linear
from ..runtime.experts import MixtureOfExperts
from ..runtime.model import Transformer
from .timing import graph_seconds, sync

# prefills timed on a GPU, their median reported: one alone moved 20-60% between runs of a short prompt (the first
# after new caches among them); on the CPU one (its prefill is slow, and the host does not run ahead of it)
PREFILL_REPEATS = 5


def _linear_bytes(module: torch.nn.Module) -> int:
    """The weight bytes of the linears in ``module`` (NVFP4: codes + block scales of the unpadded weight)."""
    total = 0
    for m in module.modules():
        if isinstance(m, NVFP4Linear):
            rows = m.out_features * (2 if m.up_offset else 1)
            total += rows * m.in_features // 2 + rows * m.in_features // 16
        elif isinstance(m, FP8Linear):
            total += m.out_features * (2 if m.up_offset else 1) * m.in_features
        elif isinstance(m, DenseLinear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def weight_bytes_per_token(model: Transformer) -> int:
    """The fewest weight bytes one decode step of one sequence reads: every linear once, of a mixture of experts
    the router and top_k of its experts (their average), plus one embedding row."""
    total = model.embed.shape[1] * model.embed.element_size() + _linear_bytes(model)
    for m in model.modules():
        if isinstance(m, MixtureOfExperts):
            experts = _linear_bytes(m.experts)
            total -= experts - experts * m.shape.top_k // m.shape.experts
    return total


@torch.no_grad()
def bench_model(model: Transformer, prompt_len: int, gen_len: int, batch: int, seed: int = 0,
                compile_decode: bool = False, speculate: int = 0, draft_model: Transformer | None = None,
                mtp=None) -> dict:
    """Prefill (the median of ``PREFILL_REPEATS`` on a GPU) and decode speed on a random prompt. ``speculate`` = k > 0
    also runs greedy speculative decoding with k drafted tokens (prompt lookup, ``draft_model``, or the MTP head
    ``mtp``) on the first prompt and reports its speed, acceptance length and whether its text equals plain
    decoding; the prompt then repeats a 16-token random chunk, so that prompt lookup finds something (batch 1
    only)."""
    from ..runtime.generate import decode_step
    from ..runtime.prompt import prompt_step_tokens, run_prompt

    device = model.device
    step_fn = decode_step(model, compile_decode)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.args.vocab_size, (batch, prompt_len), generator=gen).to(device)
    if speculate:
        if batch != 1:
            raise ValueError("bench with speculation runs batch 1")
        prompt = prompt[:, :16].repeat(1, -(-prompt_len // 16))[:, :prompt_len]
    from ..runtime.generate import cache_slots

    model.setup_caches(batch, cache_slots(model, prompt_len, gen_len))
    model(prompt[:, :8], torch.arange(8, device=device))  # warm-up: kernels compiled, caches touched
    prefill = partial(run_prompt, model, prompt, decode_step(model), prompt_step_tokens(model, batch))
    prefill()  # and the prefill path's (timed below)
    for i in range(3):  # compiles / captures the decode step when asked to; inputs built like the real ones
        tok = torch.empty(batch, dtype=torch.long, device=device).copy_(prompt[:, i])  # same strides as argmax
        step_fn(tok[:, None], torch.tensor([8 + i], device=device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    prefill_times = []
    for _ in range(PREFILL_REPEATS if device.type == "cuda" else 1):
        # the warm-ups (and a repeat) advanced any recurrent (Gated DeltaNet) states: start again from zero (the
        # same tensors, so captured graphs stay valid); KV caches are rewritten by the prefill anyway
        model.setup_caches(batch, cache_slots(model, prompt_len, gen_len))
        sync(device)
        t0 = time.perf_counter()
        logits = prefill()
        sync(device)
        prefill_times.append(time.perf_counter() - t0)
    t_prefill = statistics.median(prefill_times)
    tokens = []
    nxt = logits[:, -1].argmax(-1)
    pos = torch.tensor([prompt_len], device=device)  # kept on the device, as generate keeps it: no wait per step
    sync(device)
    t0 = time.perf_counter()
    for step in range(gen_len):
        tokens.append(nxt)
        if step == gen_len - 1:
            break
        logits = step_fn(nxt[:, None], pos)
        pos = pos + 1
        nxt = logits[:, -1].argmax(-1)
    sync(device)
    t_decode = time.perf_counter() - t0
    steps = max(gen_len - 1, 1)
    out = torch.stack(tokens, dim=1).tolist()
    per_token = weight_bytes_per_token(model)
    result = {
        "device": str(device), "dtype": str(model.dtype).replace("torch.", ""),
        "prompt_len": prompt_len, "gen_len": gen_len, "batch": batch,
        "prefill_tok_s": batch * prompt_len / t_prefill,
        "prefill_repeats": len(prefill_times),
        "decode_tok_s": batch * steps / t_decode,
        "ms_per_step": 1e3 * t_decode / steps,
        "weight_bytes_per_step": per_token,
        "bandwidth_GBps": per_token * steps / t_decode / 1e9,
        "sha256": hashlib.sha256(repr(out).encode()).hexdigest(),
        "compiled_decode": compile_decode,
        "decode_step": "torch.compile" if compile_decode else ("cuda graph" if device.type == "cuda" else "eager"),
    }
    if device.type == "cuda":
        result["peak_memory_GiB"] = torch.cuda.max_memory_allocated(device) / 1024**3
    if speculate:
        from ..runtime.generate import SamplingParams
        from ..runtime.speculative import generate_speculative

        params = SamplingParams(max_new_tokens=gen_len)
        # the warm-up is the timed run itself: its caches (and on a GPU the graphs over them) are the timed run's
        generate_speculative(model, prompt[0].tolist(), params, speculate, draft_model, mtp=mtp)
        sync(device)
        t0 = time.perf_counter()
        spec_tokens, stats = generate_speculative(model, prompt[0].tolist(), params, speculate, draft_model, mtp=mtp)
        sync(device)
        t_spec = max(time.perf_counter() - t0 - t_prefill, 1e-9)  # minus the prefill measured above
        result["speculative"] = {
            "draft_tokens": speculate,
            "drafter": "draft model" if draft_model is not None else "mtp head" if mtp is not None else "prompt lookup",
            "verify_steps": stats.verify_steps, "acceptance_length": stats.acceptance_length,
            "decode_tok_s": (len(spec_tokens) - 1) / t_spec,
            "speedup": (len(spec_tokens) - 1) / t_spec / result["decode_tok_s"],
            "sha256": hashlib.sha256(repr([spec_tokens]).encode()).hexdigest(),
            "same_text": spec_tokens == out[0],
        }
    return result


@torch.no_grad()
def verify_pass_ms(model: Transformer, ms=range(1, 9), prefix: int = 512, reps: int = 20) -> dict[int, float]:
    """Median ms of one forward of M tokens at position ``prefix`` (a speculative verify pass) for each M in
    ``ms``, replayed in a CUDA graph: what speculative decoding pays per step (CUDA only)."""
    device = model.device
    model.setup_caches(1, prefix + 16)
    model(torch.randint(0, 1000, (1, prefix), device=device), torch.arange(prefix, device=device))
    out = {}
    for m in ms:
        tok = torch.randint(0, 1000, (1, m), device=device)
        pos = torch.arange(prefix, prefix + m, device=device)
        out[m] = 1e3 * graph_seconds(lambda i: model(tok, pos), reps=1, trials=reps)
    return out
