"""One generic decoder for Llama 1/2/3, Mistral, Qwen2/2.5, Qwen3, Qwen3.5 text and SmolLM, with a static KV cache.

RMSNorm, rotary embeddings (HF "rotate half" convention, llama3 scaling, partial rotary), grouped-query
attention, SwiGLU, tied or untied embeddings, q/k/v biases (Qwen2), q/k RMSNorm (Qwen3), an output gate on the
attention (Qwen3.5), Gated DeltaNet token mixers in place of attention in some layers (Qwen3.5 hybrids:
``gated_deltanet.py``, their states beside the KV cache). The linears are built by the loader (``nn/linear.py``):
the model never sees a weight format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..dispatch.limits import DECODE_ROWS
from .. import ops  # noqa: F401  (registers torch.ops.anyfp4)
from ..kernels.gdn.reference import per_row
from ..kernels.glue.reference import rope_cache_reference
from .config import ModelArgs, rope_inv_freq
from .gated_deltanet import GatedDeltaNet


# Prefill attention backends whose forward gives the same bits run after run. cuDNN's is left out: on the H200
# greedy text over 256+ cached tokens changed from run to run with it allowed (benchmarks/NOTES.md).
DETERMINISTIC_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend_small(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention of a few query positions over the whole static cache, without repeating K/V per query head:
    q (b, h, t, hd), k/v (b, kvh, S, hd), mask (t, S) or (b, 1, t, S) boolean -> (b, h, t, hd). Scores and
    softmax in float32; deterministic (batched GEMMs, no split-KV reduction)."""
    b, h, t, hd = q.shape
    kvh = k.shape[1]
    g = h // kvh
    qg = q.reshape(b, kvh, g * t, hd)  # query head i uses kv head i // g; rows ordered (group, position)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * hd**-0.5
    m = mask.repeat(g, 1) if mask.dim() == 2 else mask.repeat(1, 1, g, 1)
    # a large finite fill: a fully masked row (a padding position) stays finite instead of NaN
    p = torch.softmax(scores.masked_fill(~m, -1e30), dim=-1).to(v.dtype)
    return torch.matmul(p, v).reshape(b, h, t, hd)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.register_buffer("weight", weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.anyfp4.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta)): a residual add and the norm after it, one launch on CUDA."""
        return torch.ops.anyfp4.add_rms_norm(x, delta, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, qkv: nn.Module, o_proj: nn.Module,
                 q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None):
        super().__init__()
        self.args = args
        self.qkv, self.o_proj = qkv, o_proj  # qkv: one fused linear, or a ModuleList of three
        if (q_norm is None) != (k_norm is None) or (q_norm is not None and q_norm.eps != k_norm.eps):
            raise ValueError("Attention: q_norm and k_norm come together, with one eps")
        self.q_norm, self.k_norm = q_norm, k_norm
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def state_tensors(self) -> list:
        """What a step reads and writes beside its inputs (a captured CUDA graph holds on to these tensors)."""
        return [self.k_cache, self.v_cache]

    def setup_cache(self, batch: int, max_seq: int, dtype: torch.dtype, device: torch.device) -> None:
        """A zeroed KV cache for ``batch`` sequences of up to ``max_seq`` tokens (the same tensors when the shape is
        unchanged: CUDA graphs captured over them stay valid)."""
        a = self.args
        shape = (batch, a.num_kv_heads, max_seq, a.head_dim)
        for name in ("k_cache", "v_cache"):
            old = getattr(self, name)
            if old is not None and old.shape == shape and old.dtype == dtype and old.device == device:
                old.zero_()
            else:
                setattr(self, name, torch.zeros(shape, dtype=dtype, device=device))

    def project(self, x: torch.Tensor):
        a = self.args
        if isinstance(self.qkv, nn.ModuleList):
            return tuple(m(x) for m in self.qkv)
        q_rows = a.num_heads * a.head_dim * (2 if a.attn_output_gate else 1)
        return self.qkv(x).split([q_rows, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim], dim=-1)

    def forward(self, x, cos, sin, mask, input_pos, key_start=None, span=None):
        a = self.args
        b, t, _ = x.shape
        q, k, v = self.project(x)
        gate = None
        if a.attn_output_gate:  # per head: its query, then its gate
            q, gate = q.view(b, t, a.num_heads, 2 * a.head_dim).split(a.head_dim, dim=-1)
        q = q.reshape(b, t, a.num_heads, a.head_dim)
        k = k.view(b, t, a.num_kv_heads, a.head_dim)
        v = v.view(b, t, a.num_kv_heads, a.head_dim)
        # The q / k norms (Qwen3), the rotary embedding of q and k (of their first rope_dim dims when the rotary is
        # partial), k and v into the caches: one launch on CUDA. Under torch.compile its pure-torch definition is
        # traced instead (fused by the compiler; the caches stay plain in-place updates, with no functionalized
        # copies of them).
        if torch.compiler.is_compiling():
            norms = None if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            q = rope_cache_reference(q, k, v, cos[:, 0], sin[:, 0], self.k_cache, self.v_cache, input_pos, norms)
        elif self.q_norm is None:
            q = torch.ops.anyfp4.rope_cache(q, k, v, cos[:, 0], sin[:, 0], self.k_cache, self.v_cache, input_pos)
        else:
            q = torch.ops.anyfp4.rope_cache(q, k, v, cos[:, 0], sin[:, 0], self.k_cache, self.v_cache, input_pos,
                                            self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        q = q.transpose(1, 2)
        return self.o_proj(self.attend(q, mask, input_pos, key_start, span, gate))

    def attend(self, q, mask, input_pos, key_start=None, span=None, gate=None):
        """q (b, h, t, hd) at the consecutive cache slots ``input_pos`` over the caches -> (b, t, h * hd).
        ``key_start`` (b,): each sequence's first valid slot (a left-padded batch); ``span``: ``visible_span`` of
        the two, read once per forward (else read here); ``gate`` (b, t, h, hd): the output gate (times sigmoid of
        it), in the attention's own launch where it runs ``small_attention``."""
        a = self.args
        b, _, t, _ = q.shape
        if t <= DECODE_ROWS and q.is_cuda:  # rows independent of t: decode and verify steps give the same bits
            y = torch.ops.anyfp4.small_attention(q, self.k_cache, self.v_cache, mask, input_pos, key_start, gate)
            return y.reshape(b, t, a.num_heads * a.head_dim)
        y = self._attend_rest(q, mask, input_pos, key_start, span)
        if gate is not None:
            y = y * per_row(torch.sigmoid, gate.reshape(b, t, a.num_heads * a.head_dim))
        return y

    def _attend_rest(self, q, mask, input_pos, key_start, span):
        """``attend`` of a longer call or off the GPU, before the gate."""
        a = self.args
        b, _, t, _ = q.shape
        if no_host_reads(q):
            # a compiled or captured step of more than DECODE_ROWS rows: the whole cache, no host values
            y = self.attend_slots(q, self.k_cache, self.v_cache, mask)
        else:
            y = self.attend_visible(q, mask, input_pos, key_start, span)
        return y.transpose(1, 2).reshape(b, t, a.num_heads * a.head_dim)

    def attend_visible(self, q, mask, input_pos, key_start, span=None):
        """Each sequence over exactly the slots it may see, its first valid one to the last new position: a prompt's
        rows get the same shapes, and so the same bits, alone and in a left-padded batch (and the cache past the
        prompt is not read)."""
        first, end, starts = span or visible_span(input_pos, key_start, q.shape[0])
        if not any(starts):
            return self.attend_slots(q, self.k_cache[:, :, :end], self.v_cache[:, :, :end], mask[..., :end])
        y = q.new_zeros(q.shape)  # a padding position sees no key; with a start the mask is (b, 1, t, S)
        for i, s in enumerate(starts):
            j = max(0, min(s - first, q.shape[2]))  # the row's first position at or past its first valid slot
            if j >= q.shape[2]:
                continue
            if q.is_cuda and q.shape[2] - j <= DECODE_ROWS:  # as the prompt alone runs: the decode kernel
                y[i:i + 1, :, j:] = torch.ops.anyfp4.small_attention(
                    q[i:i + 1, :, j:], self.k_cache[i:i + 1], self.v_cache[i:i + 1], mask[i:i + 1, :, j:],
                    input_pos[j:], key_start[i:i + 1]).transpose(1, 2)
            else:
                y[i:i + 1, :, j:] = self.attend_slots(q[i:i + 1, :, j:], self.k_cache[i:i + 1, :, s:end],
                                                      self.v_cache[i:i + 1, :, s:end], mask[i:i + 1, :, j:, s:end])
        return y

    def attend_slots(self, q, k, v, mask):
        """q (b, h, t, hd) over k/v (b, kvh, S, hd) with mask (t, S) or (b, 1, t, S) -> (b, h, t, hd)."""
        if q.shape[2] <= DECODE_ROWS:  # decode and verify steps on the CPU
            return attend_small(q, k, v, mask)
        g = self.args.num_heads // self.args.num_kv_heads
        kr, vr = (c.repeat_interleave(g, dim=1) if g > 1 else c for c in (k, v))
        with sdpa_kernel(DETERMINISTIC_SDPA):
            return F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)


def no_host_reads(x: torch.Tensor) -> bool:
    """Whether a forward over ``x`` is being compiled or captured into a CUDA graph: no value may be read back to the
    host."""
    return torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())


def visible_span(input_pos: torch.Tensor, key_start: torch.Tensor | None, batch: int) -> tuple[int, int, list[int]]:
    """(first new slot, last new slot + 1, each sequence's first valid slot) on the host, in one read of the device:
    what an attention layer's prefill needs to cut its keys to the visible slots."""
    ends = input_pos[[0, -1]].to(torch.int64)
    values = (ends if key_start is None else torch.cat([ends, key_start.to(torch.int64)])).tolist()
    return values[0], values[1] + 1, values[2:] if key_start is not None else [0] * batch


class Block(nn.Module):
    def __init__(self, attn: Attention, mlp: nn.Module, input_norm: RMSNorm, post_norm: RMSNorm):
        super().__init__()
        self.attn, self.mlp, self.input_norm, self.post_norm = attn, mlp, input_norm, post_norm

    def forward(self, x, delta, cos, sin, mask, input_pos, key_start=None, span=None):
        """x: the residual stream; delta: the previous block's MLP output not yet added to it (None before
        the first block) — each residual add is fused into the norm that follows it. Returns the
        residual stream and this block's MLP output, still to be added. ``span``: ``visible_span``, read once
        per forward."""
        if delta is None:
            n = self.input_norm(x)
        else:
            x, n = self.input_norm.add_and_norm(x, delta)
        x, n = self.post_norm.add_and_norm(x, self.attn(n, cos, sin, mask, input_pos, key_start, span))
        return x, self.mlp(n)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, embed: torch.Tensor, blocks: list[Block], norm: RMSNorm, lm_head: nn.Module):
        super().__init__()
        self.args = args
        self.register_buffer("embed", embed)
        self.blocks = nn.ModuleList(blocks)
        self.norm, self.lm_head = norm, lm_head
        self.register_buffer("inv_freq", rope_inv_freq(args).to(embed.device), persistent=False)
        self.max_seq = 0

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def setup_caches(self, batch: int, max_seq: int) -> None:
        """The static KV cache for ``batch`` sequences of up to ``max_seq`` tokens, zeroed (the same tensors
        when the shape is unchanged)."""
        a = self.args
        if max_seq > a.max_position_embeddings:
            raise ValueError(f"{max_seq} tokens exceed the model's context of {a.max_position_embeddings}")
        for blk in self.blocks:
            if isinstance(blk.attn, GatedDeltaNet):
                blk.attn.setup_state(batch)
            else:
                blk.attn.setup_cache(batch, max_seq, self.dtype, self.device)
        self.max_seq = max_seq

    def mixers_with_state(self) -> list[GatedDeltaNet]:
        """The Gated DeltaNet layers (their recurrent states cannot overwrite a position as a KV cache does)."""
        return [blk.attn for blk in self.blocks if isinstance(blk.attn, GatedDeltaNet)]

    def advancing_states(self) -> list[torch.Tensor]:
        """The tensors a step advances rather than writes at its own positions (Gated DeltaNet states): running a
        step twice changes them twice."""
        return [t for mixer in self.mixers_with_state() for t in mixer.advancing_states()]

    def setup_snapshots(self, tokens: int) -> None:
        """After ``setup_caches``: keep the recurrent states after each token of steps of up to ``tokens`` tokens."""
        for mixer in self.mixers_with_state():
            mixer.setup_snapshots(tokens)

    def keep_states(self, tokens: int, step_tokens: int) -> None:
        """The recurrent states as after the first ``tokens`` of the last step's ``step_tokens`` tokens (a verify
        step's accepted prefix); the KV cache needs nothing (later steps overwrite the rejected slots). The copies of
        every layer go in one call per dtype (a foreach call of mixed dtypes falls back to one launch per tensor; on
        an H200 the 96 copies of a 27B hybrid, one call of bf16 and float32 together, took 1.5 ms)."""
        by_dtype: dict[torch.dtype, tuple[list, list]] = {}
        for mixer in self.mixers_with_state():
            for state, snapshot in mixer.kept_states(tokens, step_tokens):
                states, snapshots = by_dtype.setdefault(state.dtype, ([], []))
                states.append(state)
                snapshots.append(snapshot)
        for states, snapshots in by_dtype.values():
            torch._foreach_copy_(states, snapshots)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, rope_pos: torch.Tensor | None = None,
                key_valid: torch.Tensor | None = None, hidden: bool = False, last: bool = False):
        """tokens (b, t) written to consecutive cache slots ``input_pos`` (t,) -> logits (b, t, vocab) in float32
        (with ``last``, of the last position only: (b, 1, vocab), what a prompt's prefill needs); with ``hidden``,
        (logits, the final norm's output (b, t, hidden_size)), which a multi-token-prediction head reads.

        Left-padded batches pass ``rope_pos`` (b, t), each row's own positions, and ``key_valid``
        (b, S), False on padding slots.
        """
        x = F.embedding(tokens, self.embed)
        cos, sin, mask, key_start = self.positions(input_pos, rope_pos, key_valid, self.max_seq)
        if key_start is None:  # one fill per forward, not one per attention call
            key_start = torch.zeros(tokens.shape[0], dtype=torch.int64, device=tokens.device)
        delta = None
        span = None  # where attention layers cut their keys on the host (Attention.attend): one read, not one a layer
        if not (tokens.shape[1] <= DECODE_ROWS and tokens.is_cuda) and not no_host_reads(tokens):
            span = visible_span(input_pos, key_start, tokens.shape[0])
        for blk in self.blocks:
            x, delta = blk(x, delta, cos, sin, mask, input_pos, key_start, span)
        n = self.norm(x) if delta is None else self.norm.add_and_norm(x, delta)[1]
        logits = self.lm_head(n[:, -1:] if last else n).float()
        return (logits, n) if hidden else logits

    def positions(self, input_pos: torch.Tensor, rope_pos: torch.Tensor | None, key_valid: torch.Tensor | None,
                  max_seq: int):
        """(cos, sin, mask, key_start) of the new positions: rotary tables (b or 1, 1, t, rotary dims) float32,
        which of the ``max_seq`` cache slots each may attend to ((t, S), or (b, 1, t, S) with ``key_valid``), and
        with ``key_valid`` each sequence's first valid slot ((b,); else None)."""
        pos = (input_pos[None, :] if rope_pos is None else rope_pos).float()
        freqs = pos[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        mask = torch.arange(max_seq, device=input_pos.device)[None, :] <= input_pos[:, None]
        key_start = None
        if key_valid is not None:
            mask = mask[None, None] & key_valid[:, None, None, :]
            key_start = key_valid.to(torch.uint8).argmax(-1)  # the first True (a row with none: 0)
        return cos, sin, mask, key_start
