"""Launch configurations of the decode and prefill kernels: frozen dataclasses with named fields. The kernels take
them as arguments; which one a call gets is ``dispatch.tuning``'s decision (launch tables, heuristics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MMAConfig:
    """The CUDA decode kernel (``kernels.cuda.weight_mma``)."""
    mt: int = 1  # m16 tiles per warp
    warps: int = 8
    split_k: int = 1
    depth: int = 2  # main-loop steps of code words in flight per thread
    kw: int = 1  # warps along K per row tile (a power of two dividing warps): they add their sums in shared memory
    shared_ring: int = 0  # 1: the ring of depth steps in shared memory (cp.async, sm_80+), not in registers
    wgmma: int = 0  # sm_90, kw 1: warpgroup mmas reading the activations from shared memory themselves; 1: a
    # step waits for its own, 2: they run on while the next step decodes


@dataclass(frozen=True)
class DecodeConfig:
    """The Triton decode kernels (``kernels.triton.nvfp4_decode``, ``nvfp4_gemv``): one program's tile and K slices."""
    block_n: int = 64
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class FusedConfig:
    """The Triton prefill GEMM that decodes weight tiles in registers (``ANYFP4_PREFILL=fused``)."""
    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 8
    num_stages: int = 3
    split_k: int = 1
    swap_ab: bool = False  # the decoded weight tile as the multiply's first operand (kernels/triton/nvfp4_decode._dot)
