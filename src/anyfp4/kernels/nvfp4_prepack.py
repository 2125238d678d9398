"""Prepack: ModelOpt NVFP4 tensors -> the resident layout the NVFP4 kernels read, and its inverse.

Layout (``NVFP4Prepacked``), for a weight of N rows (out_features) and K columns (in_features):

- ``codes``: (N_pad, K_pad // 8) int32. Word ``j`` of row ``n`` holds the E2M1 codes of
  ``k = 8j .. 8j + 7``, code ``8j + i`` in bits ``4i .. 4i + 3``. This is the checkpoint's byte
  order read as little-endian 32-bit words, so a kernel fetches 8 weights per 4-byte load
  and splits them with shifts; rows are contiguous so a tile of rows is read coalesced.
- ``scales``: (N_pad, K_pad // 16) uint8, the raw E4M3 block-scale bytes (non-negative).
- ``global_scale``: (1,) float32 on the device, so no host sync is needed to read it.

``N_pad`` rounds N up to ``ROW_ALIGN`` and ``K_pad`` rounds K up to ``K_ALIGN``; padding holds
code 0 (value 0) and scale 0, so padded rows and columns contribute exact zeros and the
kernels crop the output to N. Activations are never padded: kernels mask k >= K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight

ROW_ALIGN = 128  # the largest row tile of any NVFP4 kernel configuration
K_ALIGN = 256  # the largest K tile


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


@dataclass(frozen=True)
class NVFP4Prepacked:
    codes: torch.Tensor  # (N_pad, K_pad // 8) int32
    scales: torch.Tensor  # (N_pad, K_pad // 16) uint8
    global_scale: torch.Tensor  # (1,) float32
    out_features: int  # columns of the op's output (for a gated weight: of gate alone)
    in_features: int
    up_offset: int = 0  # gated weights: row where the up projection starts (gate rows come first)

    @property
    def gated(self) -> bool:
        return self.up_offset > 0


def prepack_nvfp4(weight: NVFP4Weight, device: torch.device | str | None = None) -> NVFP4Prepacked:
    """Pad and reinterpret ModelOpt tensors (codes (N, K/2) uint8, scales (N, K/16) e4m3)."""
    n, k = weight.shape
    if k % GROUP_SIZE:
        raise ValueError(f"NVFP4 in_features must be a multiple of {GROUP_SIZE}, got {k}")
    if weight.block_scale.shape != (n, k // GROUP_SIZE):
        raise ValueError(f"block scales must be ({n}, {k // GROUP_SIZE}), got {tuple(weight.block_scale.shape)}")
    device = torch.device(device) if device is not None else weight.packed.device
    n_pad, k_pad = _round_up(n, ROW_ALIGN), _round_up(k, K_ALIGN)
    codes = torch.zeros(n_pad, k_pad // 2, dtype=torch.uint8, device=device)
    codes[:n, : k // 2] = weight.packed.to(device)
    scales = torch.zeros(n_pad, k_pad // GROUP_SIZE, dtype=torch.uint8, device=device)
    scales[:n, : k // GROUP_SIZE] = weight.block_scale.to(device).view(torch.uint8)
    global_scale = weight.global_scale.to(device=device, dtype=torch.float32).reshape(1).clone()
    if device.type == "cuda":
        from .weight_mma import reserve_counters

        reserve_counters(device)
    return NVFP4Prepacked(codes.view(torch.int32), scales, global_scale, n, k)


def prepack_nvfp4_gated(gate: NVFP4Weight, up: NVFP4Weight, device: torch.device | str | None = None) -> NVFP4Prepacked:
    """Gate and up stacked along N for ``silu(gate) * up`` in one launch: each half padded on its
    own, so the up projection starts at row ``up_offset`` (a multiple of ``ROW_ALIGN``)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must have the same shape")
    if not torch.equal(gate.global_scale.float().reshape(()), up.global_scale.float().reshape(())):
        raise ValueError("gate and up must share one global scale (ModelOpt's export gives them one)")
    g, u = prepack_nvfp4(gate, device), prepack_nvfp4(up, device)
    half = g.codes.shape[0]
    return NVFP4Prepacked(torch.cat([g.codes, u.codes]), torch.cat([g.scales, u.scales]), g.global_scale,
                          gate.shape[0], gate.shape[1], up_offset=half)


def _crop(p: NVFP4Prepacked, row0: int) -> NVFP4Weight:
    n, k = p.out_features, p.in_features
    packed = p.codes.view(torch.uint8)[row0:row0 + n, : k // 2].contiguous()
    scales = p.scales[row0:row0 + n, : k // GROUP_SIZE].contiguous().view(torch.float8_e4m3fn)
    return NVFP4Weight(packed, scales, p.global_scale.reshape(()).clone())


def unprepack_nvfp4(p: NVFP4Prepacked) -> NVFP4Weight:
    """The exact inverse of ``prepack_nvfp4`` (crops the padding). For a gated prepack: the gate."""
    return _crop(p, 0)


def unprepack_nvfp4_gated(p: NVFP4Prepacked) -> tuple[NVFP4Weight, NVFP4Weight]:
    """The exact inverse of ``prepack_nvfp4_gated``: (gate, up)."""
    if not p.gated:
        raise ValueError("not a gated prepack")
    return _crop(p, 0), _crop(p, p.up_offset)

