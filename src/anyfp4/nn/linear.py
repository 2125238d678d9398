"""Linear layers over NVFP4, FP8 and float weights; fused q/k/v and gate/up where the scales allow.

Each layer prepacks once, at construction (on a GPU it also reserves the CUDA kernel's split-K counters then, so
that a CUDA graph captured later allocates nothing); ``forward`` calls one op. NVFP4 goes through
``torch.ops.anyfp4.*`` (kernels on CUDA, the reference on the CPU), and so does FP8 — each op through its
``.default`` overload, which skips the overload packet's Python resolution (~7 us a call on a 2-core CPU, where a
small layer's whole call is ~40).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops  # noqa: F401  (registers torch.ops.anyfp4)
from ..dispatch.limits import DECODE_ROWS, SMALL_DENSE_OUTPUTS
from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import NVFP4Weight
from ..kernels.cuda.counters import reserve_counters_for
from ..packing.fp8 import prepack_fp8, prepack_fp8_gated
from ..packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

Weight = NVFP4Weight | FP8Weight | torch.Tensor


class NVFP4Linear(nn.Module):
    def __init__(self, weight: NVFP4Weight, bias: torch.Tensor | None, device, gated_up: NVFP4Weight | None = None):
        super().__init__()
        p = prepack_nvfp4_gated(weight, gated_up, device) if gated_up is not None else prepack_nvfp4(weight, device)
        reserve_counters_for(p.codes)
        self.register_buffer("codes", p.codes)
        self.register_buffer("scales", p.scales)
        self.register_buffer("global_scale", p.global_scale)
        self.register_buffer("bias", bias.to(device) if bias is not None else None)
        self.out_features, self.in_features, self.up_offset = p.out_features, p.in_features, p.up_offset
        self.split_k = 0  # 0: the launch table's; tensor parallelism sets the full layer's (see parallel.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.up_offset:
            return torch.ops.anyfp4.nvfp4_gated.default(x, self.codes, self.scales, self.global_scale, self.up_offset,
                                                        self.out_features, self.in_features, self.split_k)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return torch.ops.anyfp4.nvfp4_linear.default(x, self.codes, self.scales, self.global_scale, bias,
                                                     self.out_features, self.in_features, self.split_k)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` before the global scale, float32, unrounded, no bias: a row-parallel rank's share."""
        return torch.ops.anyfp4.nvfp4_linear_partial.default(x, self.codes, self.scales, self.global_scale,
                                                             self.out_features, self.in_features, self.split_k)

    def scale_partial(self, total: torch.Tensor) -> torch.Tensor:
        """The ranks' summed shares times the global scale (float32; the caller rounds once)."""
        return total * self.global_scale


def shared_input_scale(weights: list[FP8Weight]) -> torch.Tensor | None:
    """One activation scale for FP8 projections fused into one GEMM: the largest of theirs (so no input
    saturates earlier than in its own projection), or None unless every one has a scale."""
    scales = [w.input_scale for w in weights]
    if any(s is None for s in scales):
        return None
    return torch.stack([s.float().reshape(()).cpu() for s in scales]).max()


class FP8Linear(nn.Module):
    """Per-channel scales (a per-tensor scale is broadcast): fused projections concatenate exactly."""

    def __init__(self, weight: FP8Weight, bias: torch.Tensor | None, device, gated_up: FP8Weight | None = None):
        super().__init__()
        p = prepack_fp8_gated(weight, gated_up, device) if gated_up is not None else prepack_fp8(weight, device)
        reserve_counters_for(p.codes)
        self.register_buffer("codes", p.codes)
        self.register_buffer("scales", p.scales)
        # the static activation scale of a W8A8 checkpoint (the opt-in W8A8 prefill quantizes with it)
        input_scale = shared_input_scale([weight] if gated_up is None else [weight, gated_up])
        self.register_buffer("input_scale", input_scale.reshape(1).to(device) if input_scale is not None else None)
        self.register_buffer("bias", bias.to(device) if bias is not None else None)
        self.out_features, self.in_features, self.up_offset = p.out_features, p.in_features, p.up_offset
        self.split_k = 0  # 0: the launch table's; tensor parallelism sets the full layer's (see parallel.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.up_offset:
            return torch.ops.anyfp4.fp8_gated.default(x, self.codes, self.scales, self.up_offset, self.out_features,
                                                      self.in_features, self.split_k, self.input_scale)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return torch.ops.anyfp4.fp8_linear.default(x, self.codes, self.scales, bias, self.out_features,
                                                   self.in_features, self.split_k, self.input_scale)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` before the row scales, float32, unrounded, no bias: a row-parallel rank's share."""
        return torch.ops.anyfp4.fp8_linear_partial.default(x, self.codes, self.scales, self.out_features,
                                                           self.in_features, self.split_k)

    def scale_partial(self, total: torch.Tensor) -> torch.Tensor:
        """The ranks' summed shares times the row scales (float32; the caller rounds once)."""
        return total * self.scales[: self.out_features]




class DenseLinear(nn.Module):
    """cuBLAS; on a GPU a call of at most ``DECODE_ROWS`` rows runs on exactly ``DECODE_ROWS`` rows (zero
    padded), or for a layer of at most ``SMALL_DENSE_OUTPUTS`` outputs through one Triton GEMV launch (with
    ``ANYFP4_PREFILL=chunked`` a longer call too: its rows' bits do not depend on the row count). cuBLAS picks
    its kernel, and so each row's summation order, by shape: one shape for every small step makes a row's output
    independent of how many rows share the step (a one-token decode step and a speculative verify pass give the
    same bits). At <= 32 rows the GEMM reads the weight once either way, so the padding costs ~1-3% of the layer
    (H200, benchmarks/NOTES.md). On the CPU such calls, and every call of a layer of at most
    ``SMALL_DENSE_OUTPUTS`` outputs (a Gated DeltaNet's a / b projections, in prompts too), run the C kernels'
    dense rows (``kernels.cpu``: one fixed order of sums per row; torch's float32 GEMM sums a row in another order
    for another row count), where they are built; larger calls stay torch's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, device, dtype):
        super().__init__()
        self.register_buffer("weight", weight.to(device=device, dtype=dtype))
        self.register_buffer("bias", bias.to(device=device, dtype=dtype) if bias is not None else None)

    def takes_gemv(self, x: torch.Tensor) -> bool:
        """Whether a call on ``x`` runs the Triton GEMV (``dense_gemv``), whose rows another launch may compute in
        its place with the same bits (``ops.causal_conv_proj``)."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return x.is_cuda and 0 < rows and self.weight.shape[0] <= SMALL_DENSE_OUTPUTS and (
            rows <= DECODE_ROWS or _chunked_prefill())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if self.takes_gemv(x):
            from ..kernels.triton.dense_gemv import dense_gemv

            return dense_gemv(x, self.weight, self.bias)
        if x.is_cuda and 0 < rows <= DECODE_ROWS:
            padded = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, DECODE_ROWS - rows))
            return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)
        small = rows <= DECODE_ROWS or self.weight.shape[0] <= SMALL_DENSE_OUTPUTS
        if x.device.type == "cpu" and 0 < rows and small and not torch.compiler.is_compiling():
            y = self._cpu_rows(x.reshape(rows, x.shape[-1]))
            if y is not None:
                return y.reshape(*x.shape[:-1], -1)
        return F.linear(x, self.weight, self.bias)

    def _cpu_rows(self, x2: torch.Tensor) -> torch.Tensor | None:
        """``F.linear`` of a few rows by the C kernels' dense rows, rounded to x's dtype; None where they are not
        built or do not take this weight (torch's then)."""
        from ..kernels.cpu.linear import W_DTYPES, dense_rows, library

        lib = library()
        if lib is None or self.weight.dtype not in W_DTYPES or self.weight.stride(-1) != 1:
            return None
        y = dense_rows(lib, x2, self.weight)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x2.dtype)

    def scale_partial(self, total: torch.Tensor) -> torch.Tensor:
        return total

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` in float32, no bias (on a GPU cuBLAS writes its float32 sums unrounded)."""
        if not x.is_cuda:
            return F.linear(x, self.weight).float()
        x2 = x.reshape(-1, x.shape[-1])
        return torch.mm(x2, self.weight.t(), out_dtype=torch.float32).reshape(*x.shape[:-1], -1)


def _chunked_prefill() -> bool:
    """``ANYFP4_PREFILL=chunked``: prompts' rows as decode steps compute them (their bits independent of the row
    count), so a small float layer runs them through its decode GEMV too."""
    from ..env import prefill_mode

    return prefill_mode() == "chunked"


def _cat_bias(biases: list, sizes: list[int], like: torch.Tensor | None) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(n, dtype=like.dtype) for b, n in zip(biases, sizes)])


def _same_scale(weights: list[NVFP4Weight]) -> bool:
    g = weights[0].global_scale.float().reshape(())
    return all(torch.equal(w.global_scale.float().reshape(()), g) for w in weights[1:])


def fused_linear(weights: list[Weight], biases: list, device, dtype) -> nn.Module | None:
    """One layer for projections that read the same input (stacked along N), or None when their
    formats (or NVFP4 global scales) differ and they must stay separate."""
    kinds = {type(w) for w in weights}
    if len(kinds) != 1:
        return None
    sizes = [w.shape[0] for w in weights]
    bias = _cat_bias(biases, sizes, next((b for b in biases if b is not None), None))
    first = weights[0]
    if isinstance(first, NVFP4Weight):
        if not _same_scale(weights):
            return None
        cat = NVFP4Weight(torch.cat([w.packed for w in weights]), torch.cat([w.block_scale for w in weights]),
                          first.global_scale)
        return NVFP4Linear(cat, bias, device)
    if isinstance(first, FP8Weight):
        scales = [w.scale.float().reshape(-1).expand(w.weight.shape[0]) for w in weights]
        return FP8Linear(FP8Weight(torch.cat([w.weight for w in weights]), torch.cat(scales),
                                   shared_input_scale(weights)), bias, device)
    return DenseLinear(torch.cat(weights), bias, device, dtype)


def make_linear(weight: Weight, bias: torch.Tensor | None, device, dtype) -> nn.Module:
    if isinstance(weight, NVFP4Weight):
        return NVFP4Linear(weight, bias, device)
    if isinstance(weight, FP8Weight):
        return FP8Linear(weight, bias, device)
    return DenseLinear(weight, bias, device, dtype)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``: one gated launch for NVFP4 gate/up sharing a global scale
    or for FP8 gate/up, else one fused gate/up GEMM (or two) and the activation in torch."""

    def __init__(self, gate: Weight, up: Weight, down: Weight, device, dtype):
        super().__init__()
        self.intermediate = gate.shape[0]
        self.gated = None
        self.gate_up = None
        self.gate = self.up = None
        if isinstance(gate, NVFP4Weight) and isinstance(up, NVFP4Weight) and _same_scale([gate, up]):
            self.gated = NVFP4Linear(gate, None, device, gated_up=up)
        elif isinstance(gate, FP8Weight) and isinstance(up, FP8Weight):
            self.gated = FP8Linear(gate, None, device, gated_up=up)
        else:
            self.gate_up = fused_linear([gate, up], [None, None], device, dtype)
            if self.gate_up is None:
                self.gate, self.up = make_linear(gate, None, device, dtype), make_linear(up, None, device, dtype)
        self.down = make_linear(down, None, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated is not None:
            h = self.gated(x)
        elif self.gate_up is not None:
            g, u = self.gate_up(x).split(self.intermediate, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.silu(self.gate(x)) * self.up(x)
        return self.down(h)
