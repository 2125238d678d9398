"""Prefill + token-by-token decode over the static KV cache; greedy or sampled; stop tokens.

Prompts of different lengths are left-padded: padding slots are masked out of attention and
each row's rotary positions start at its first real token, so a row's tokens are those it
would get alone (up to floating-point reduction order).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .model import Transformer
from .prompt import prompt_step_tokens, run_prompt


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be >= 1")


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (b, vocab) float32 -> the sampling distribution (b, vocab) after temperature, top-k, top-p
    (``params.temperature`` > 0)."""
    logits = logits / params.temperature
    if params.top_k is not None:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < params.top_p  # always keeps the first
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits (b, vocab) float32 -> next tokens (b,)."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(probabilities(logits, params), 1, generator=generator).squeeze(-1)


MAX_DRAFT_TOKENS = 16


CACHE_SLOT_BLOCK = 256  # on CUDA, KV-cache lengths are whole blocks of this many slots


def cache_slots(model: Transformer, prompt_len: int, max_new_tokens: int) -> int:
    """KV-cache slots for one generation: prompt, new tokens and room for a speculative verify pass past
    the last token (at most the model's context). Plain and speculative decoding allocate the same, so they run
    the same shapes (the same prefill bits). On CUDA the length is rounded up to whole CACHE_SLOT_BLOCKs: later
    generations of about the same length (a chat's turns, a warm-up before a timed run) reuse the cache and the
    CUDA graphs captured over it instead of capturing them again. On the CPU (no graphs; attention reads the
    whole cache) it is what the generation needs."""
    need = prompt_len + max_new_tokens + MAX_DRAFT_TOKENS + 1
    if model.device.type == "cuda":
        need = -(-need // CACHE_SLOT_BLOCK) * CACHE_SLOT_BLOCK
    return min(need, model.args.max_position_embeddings)


def check_context(prompt_len: int, max_new_tokens: int, context: int, draft_tokens: int = 0) -> None:
    """Refuse a generation that would run past the model's context: the prompt, the new tokens and, when
    decoding speculatively with ``draft_tokens`` drafts, the verify pass's room past the last token.
    Callers can check before any weights are loaded (only the prompt's length and the config are needed)."""
    room = draft_tokens + 1 if draft_tokens else 0
    if prompt_len + max_new_tokens + room > context:
        extra = f" + {room} for speculation" if room else ""
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}){extra} exceeds the "
                         f"model's context of {context} tokens")


_COMPILED: "weakref.WeakKeyDictionary[Transformer, Callable]" = weakref.WeakKeyDictionary()


_GRAPHED: "weakref.WeakKeyDictionary[Transformer, Callable]" = weakref.WeakKeyDictionary()


def decode_step(model: Transformer, compile_decode: bool = False) -> Callable:
    """What runs one-token decode steps: torch.compile when asked (``--compile``); otherwise, on CUDA, the
    step captured in an explicit CUDA graph (``cuda_graph.GraphedDecodeStep``), cached per model; on the
    CPU the model itself."""
    if compile_decode:
        return compiled_decode_step(model)
    if model.device.type != "cuda":
        return model
    if model not in _GRAPHED:
        from .cuda_graph import GraphedDecodeStep

        _GRAPHED[model] = GraphedDecodeStep(model)
    return _GRAPHED[model]


def launches_ahead(device: torch.device) -> bool:
    """Whether ``generate`` launches decode step t + 1 before step t's tokens reach the host: on a GPU, so that
    the host's reading of the tokens (a wait for the device), the stop checks and ``on_tokens`` run while the next
    step computes, instead of leaving the GPU idle between steps. The cost: one step computed in vain after the
    last row stops. On the CPU every step is computed in the calling thread, so nothing would overlap."""
    return device.type == "cuda"


def token_reader(device: torch.device, rows: int) -> Callable[[torch.Tensor], Callable[[], list[int]]]:
    """``stage(tokens)`` starts copying a step's tokens (rows,) to the host and returns what waits for that copy
    alone and gives them as a list. On a GPU the copy goes to pinned memory without waiting, and the wait is for
    an event recorded after it, so that work queued later (the next step) keeps running; a plain ``tolist`` would
    wait for all of it."""
    if device.type != "cuda":
        return lambda tokens: tokens.tolist
    landing = torch.empty(rows, dtype=torch.long, pin_memory=True)
    copied = torch.cuda.Event()

    def stage(tokens: torch.Tensor) -> Callable[[], list[int]]:
        landing.copy_(tokens, non_blocking=True)
        copied.record()

        def read() -> list[int]:
            copied.synchronize()
            return landing.tolist()
        return read
    return stage


def forget_decode_graphs(model: Transformer) -> None:
    """Drop the model's captured decode graph (e.g. after changing ``ANYFP4_KERNELS``)."""
    _GRAPHED.pop(model, None)


def compiled_decode_step(model: Transformer) -> Callable:
    """The model's forward compiled for one-token decode steps (fixed shapes, so one graph; on
    CUDA with ``mode="reduce-overhead"``, which captures it in a CUDA graph). Cached per model."""
    if model not in _COMPILED:
        mode = "reduce-overhead" if model.device.type == "cuda" else "default"
        _COMPILED[model] = torch.compile(model, fullgraph=True, dynamic=False, mode=mode)
    return _COMPILED[model]


def left_padded(prompts: Sequence[Sequence[int]], slots: int, device) -> tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor, bool]:
    """A batch of prompts as ``generate`` lays it out in a cache of ``slots``: (tokens (b, longest), left-padded
    with 0; key_valid (b, slots), True on each prompt's slots; rope positions (b, longest), each prompt's own,
    0 on padding; whether any prompt is padded)."""
    b, longest = len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros(b, longest, dtype=torch.long, device=device)
    valid = torch.zeros(b, slots, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        tokens[i, longest - len(p):] = torch.tensor(list(p), dtype=torch.long)
        valid[i, longest - len(p):] = True
    rope = (valid[:, :longest].long().cumsum(-1) - 1).clamp(min=0)
    return tokens, valid, rope, not bool(valid[:, :longest].all())


@torch.no_grad()
def generate(model: Transformer, prompts: Sequence[Sequence[int]], params: SamplingParams,
             on_tokens: Callable[[list[int]], None] | None = None, compile_decode: bool = False) -> list[list[int]]:
    """New tokens for each prompt (stopping at a stop token, which is included, or at the limit).
    ``on_tokens`` receives each step's tokens (one per row) as they are produced, while the next step runs on a
    GPU; an exception it raises ends the generation there and propagates (how a caller stops early: a cancelled
    request, a stop string).
    The prompt runs as ``prompt.run_prompt`` runs it (one forward; with ``ANYFP4_PREFILL=chunked`` on a GPU, graphed
    steps of a few tokens per row). Decode steps run through ``decode_step`` (a CUDA graph on GPUs; torch.compile
    with ``compile_decode``)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = model.device
    b, longest = len(prompts), max(len(p) for p in prompts)
    limit = model.args.max_position_embeddings
    check_context(longest, params.max_new_tokens, limit)
    slots = cache_slots(model, longest, params.max_new_tokens)
    model.setup_caches(b, slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, device)
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    logits = run_prompt(model, tokens, decode_step(model), prompt_step_tokens(model, b), rope if padded else None,
                        valid if padded else None)
    if not bool(torch.isfinite(logits[:, -1]).all()):  # once per call: NaN logits would decode to silence
        raise ValueError("the model's logits after the prompt are NaN or Inf: its weights overflow the "
                         f"activation dtype ({model.dtype}); try --dtype fp32 or check the checkpoint")
    next_pos = rope[:, -1] + 1
    step_fn = decode_step(model, compile_decode)
    next_slot = torch.tensor([longest], device=device)  # kept on the device: no copy from the host (a wait) per step
    ahead = launches_ahead(device)

    def launch(step: int, tokens_now: torch.Tensor) -> torch.Tensor:
        """Step ``step``'s forward over its tokens (still on the device), then its sampled tokens."""
        nonlocal next_pos, next_slot
        valid[:, longest + step] = True
        logits = step_fn(tokens_now[:, None], next_slot, next_pos[:, None] if padded else None,
                         valid if padded else None)
        next_pos, next_slot = next_pos + 1, next_slot + 1
        return sample(logits[:, -1], params, generator)

    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    stops = set(params.stop_token_ids)
    stage = token_reader(device, b)
    nxt = sample(logits[:, -1], params, generator)
    for step in range(params.max_new_tokens):
        final = step == params.max_new_tokens - 1
        read = stage(nxt)
        following = launch(step, nxt) if ahead and not final else None
        step_tokens = read()
        for i, t in enumerate(step_tokens):
            if not done[i]:
                out[i].append(t)
                done[i] = t in stops
        last = all(done) or final
        if not last and following is None:  # the next step is launched before on_tokens runs
            following = launch(step, nxt)
        if on_tokens is not None:
            on_tokens(step_tokens)
        if last:
            break
        nxt = following
    return out
