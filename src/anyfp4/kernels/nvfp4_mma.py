"""NVFP4 decode GEMM for M <= 32 on sm_80+ as a CUDA C++ kernel (``cuda/nvfp4_mma.cu``, compiled at
run time by NVRTC): weights decoded in registers straight into the A operand of ``mma.sync``
m16n8k16, so nothing goes through shared memory but the activations. The source file explains the
decode and the split-K; this module holds the launch configuration and the launcher.

It reads the same prepack as the Triton kernels (``nvfp4_prepack``), which stay the portable path
for sm_70/75 and wherever NVRTC is missing; ``ANYFP4_KERNELS=triton`` forces them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import torch

from . import nvrtc
from .nvfp4_prepack import NVFP4Prepacked

MAX_MMA_M = 32
MIN_SM = 80
STEP_K = 128  # k per main-loop step


@dataclass(frozen=True)
class MMAConfig:
    mt: int = 1  # m16 tiles per warp
    warps: int = 4
    split_k: int = 1
    depth: int = 4  # 128-wide k steps of code words in flight per thread


@functools.cache
def _source() -> str:
    return resources.files("anyfp4.kernels").joinpath("cuda/nvfp4_mma.cu").read_text()


def n_tiles_for(m: int) -> int:
    return 1 if m <= 8 else 2 if m <= 16 else 4


def stage_k(m: int) -> int:
    """k staged in shared memory per round: a power of two in [128, 4096], at most 32 KiB."""
    kc = 4096
    while kc > STEP_K and m * (kc // 2 + 4) * 4 > 32 * 1024:
        kc //= 2
    return kc


def rows_per_block(c: MMAConfig) -> int:
    return c.warps * c.mt * 16


def heuristic_config(n_rows: int, k_pad: int, m: int, sms: int, gated: bool) -> MMAConfig:
    """Enough blocks to fill the GPU a few times over, split-K only as far as needed and while the
    fp32 partials stay small next to the weight bytes."""
    nt = n_tiles_for(m)
    mt = 1 if (nt > 1 or gated) else 2
    c = MMAConfig(mt=mt, warps=4)
    blocks = -(-n_rows // rows_per_block(c))
    steps = k_pad // STEP_K
    split = 1
    while (blocks * split < 3 * sms and split * 2 <= steps // 2
           and (split * 2) * m * 8 * (2 if gated else 1) <= 0.15 * k_pad * 0.5625):
        split *= 2
    return MMAConfig(mt=mt, warps=4, split_k=split)


_COUNTERS: dict[int, torch.Tensor] = {}
COUNTER_SLOTS = 1 << 16


def _counters(device: torch.device) -> torch.Tensor:
    """Per-device split-K arrival counters; every kernel leaves them at zero."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    buf = _COUNTERS.get(index)
    if buf is None:
        buf = _COUNTERS[index] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return buf


def supported(x: torch.Tensor, sm: int) -> bool:
    return sm >= MIN_SM and x.shape[0] <= MAX_MMA_M and nvrtc.available()


def nvfp4_mma_gemm(x: torch.Tensor, w: NVFP4Prepacked, bias: torch.Tensor | None, config: MMAConfig,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) with M <= 32, fp16/bf16, last dim contiguous -> (M, N). Checked by the op."""
    m, k = x.shape
    if m > MAX_MMA_M:
        raise ValueError(f"nvfp4_mma_gemm handles M <= {MAX_MMA_M}, got {m}")
    c = config
    n_rows = w.out_features
    rows_total, k_pad = w.codes.shape[0], w.codes.shape[1] * 8
    block_rows = rows_per_block(c)
    grid_x = -(-n_rows // block_rows)
    if grid_x * block_rows > (w.up_offset if w.gated else rows_total):
        raise ValueError(f"row tile {block_rows} overruns the prepack's {rows_total} rows")
    nt = n_tiles_for(m)
    kc = stage_k(m)
    defines = dict(NT=nt, MT=c.mt, WARPS=c.warps, DEPTH=c.depth, BF16=int(x.dtype == torch.bfloat16), GATED=int(w.gated),
                   HAS_BIAS=int(bias is not None))
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    kernel = nvrtc.load(_source(), "anyfp4_nvfp4_mma", defines, device)
    if out is None:
        out = torch.empty(m, n_rows, dtype=x.dtype, device=x.device)
    if c.split_k > 1:
        if grid_x > COUNTER_SLOTS:
            raise ValueError(f"{grid_x} row tiles exceed the {COUNTER_SLOTS} split-K counters")
        partial = torch.empty(c.split_k, m, rows_total, dtype=torch.float32, device=x.device)
        counters = _counters(x.device)
    else:
        partial, counters = out, out
    smem = m * (kc // 2 + 4) * 4
    kernel.launch((grid_x, c.split_k, 1), c.warps * 32, smem, [
        x, w.codes, w.scales, w.global_scale, bias if bias is not None else out, out, partial, counters,
        m, k, n_rows, w.up_offset, rows_total, w.codes.stride(0) // 4, w.scales.stride(0) // 2, x.stride(0), out.stride(0), k_pad // STEP_K, kc,
    ])
    return out
