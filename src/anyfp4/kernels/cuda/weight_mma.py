"""Weight-only decode GEMM for M <= 64 on sm_80+ as a CUDA C++ kernel (``cuda/weight_mma.cu``, compiled at
run time by NVRTC) for NVFP4 and FP8 prepacks: weights decoded in registers straight into the A operand of
``mma.sync`` m16n8k16, so nothing but the activations goes through shared memory. The source file explains
the decode and the split-K; this module holds launch configurations and the launchers. On sm_90 a launch may give
the decoded fragments to warpgroup mmas instead (``MMAConfig.wgmma``; compiled for sm_90a), which read the activations
from shared memory themselves.

It reads the same prepacks as the Triton kernels (``packing/nvfp4.py``, ``packing/fp8.py``), which stay the
portable path for sm_70/75 and wherever NVRTC is missing; ``ANYFP4_KERNELS=triton`` forces them. The source's
layout and decode constants come from ``weight_mma_defines``, with every launch's defines.

A mixture of experts' grouped launch (``plan_experts_launch``, ``experts_mma``) runs every (token, expert) pair of a
decode step in one grid, each pair's expert read from the ids on the GPU.

Split-K blocks meet through per-device arrival counters (``counters.reserve_counters``), reserved when a layer
makes its prepack on a GPU so that CUDA-graph capture never allocates; kernels sharing them must run on one
stream at a time (as a model's layers do).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from importlib import resources

import torch

from ...dispatch.configs import MMAConfig
from ...dispatch.limits import MMA_CHUNK_ROWS
from ..device import device_arch, early_launch
from . import nvrtc
from .counters import COUNTER_SLOTS, reserve_counters
from .weight_mma_defines import K_PER_WORD, STEP_K, source_defines
from .weight_mma_geometry import (STAGE_BYTES, k_slices, k_warps_refusal, n_tiles_for, ring_bytes, rows_per_block,
                                  shared_bytes, stage_k)

MIN_SM = 75  # sm_75: fp16 activations, two m16n8k8 mmas per m16n8k16 product, staging copies through registers
ASYNC_SM = 80  # sm_80+: the m16n8k16 mma (fp16 and bf16) and cp.async staging
WGMMA_SM = 90  # MMAConfig.wgmma: warpgroup mmas, compiled for sm_90a (nvrtc)
# sm_70: fp16 activations, each quad pair's m8n8k4 products over its k slots (QUAD_PAIRS in the source); compiled
# by CUDA 12's NVRTC (CUDA 13's no longer targets sm_70: ANYFP4_NVRTC names another libnvrtc).
SOURCE_MIN_SM = 70
LAST_NVRTC_FOR_SM70 = 12
QUAD_PAIR_SUMS = 128  # sm_70: the most float32 sums a thread keeps (16 per m16 x n8 tile; 128 fit without spills)


def fits_arch(sm: int, mt: int, n_tiles: int, gated: bool) -> bool:
    """Whether a launch of ``mt`` m16 tiles per warp (two sets when gated) and ``n_tiles`` n8 tiles fits sm_``sm``:
    on sm_70 each tile keeps a quad pair's 16 sums, four times the m16n8k16 layout's 4."""
    return sm >= MIN_SM or (2 if gated else 1) * mt * n_tiles * 16 <= QUAD_PAIR_SUMS


def arch_defines(sm: int) -> dict:
    """The source's architecture switches for sm_``sm``: the mma shape (QUAD_PAIRS: sm_70's m8n8k4, MMA_K8:
    sm_75's m16n8k8, else m16n8k16) and whether staging copies are cp.async (ASYNC_COPY)."""
    return dict(QUAD_PAIRS=int(sm < MIN_SM), MMA_K8=int(MIN_SM <= sm < ASYNC_SM), ASYNC_COPY=int(sm >= ASYNC_SM))


KERNEL = "anyfp4_weight_mma"


@functools.cache
def source_text() -> str:
    return resources.files("anyfp4.kernels.cuda").joinpath("weight_mma.cu").read_text()


def enabled(sm: int, dtype: torch.dtype = torch.float16) -> bool:
    """The CUDA kernel serves this GPU and activation dtype: sm_80+ (sm_70 / sm_75 for fp16), NVRTC found (for
    sm_70 one of CUDA 12 or older), and ``ANYFP4_KERNELS`` allows it."""
    from ...env import kernel_choice

    choice = kernel_choice()
    if choice == "triton":
        return False
    found = nvrtc.available()
    refusal = None
    if sm < (ASYNC_SM if dtype == torch.bfloat16 else SOURCE_MIN_SM) or not found:
        refusal = (f"the CUDA kernels need sm_{SOURCE_MIN_SM}+ (sm_{ASYNC_SM}+ for bf16) and NVRTC (this GPU is "
                   f"sm_{sm}, NVRTC {'found' if found else 'not found'}, activations "
                   f"{str(dtype).replace('torch.', '')})")
    elif sm < MIN_SM and nvrtc.version()[0] > LAST_NVRTC_FOR_SM70:
        refusal = (f"NVRTC {'.'.join(map(str, nvrtc.version()))} no longer compiles for sm_{sm}: point ANYFP4_NVRTC "
                   f"at CUDA {LAST_NVRTC_FOR_SM70}'s libnvrtc.so.{LAST_NVRTC_FOR_SM70} (pip install "
                   f"nvidia-cuda-nvrtc-cu12)")
    if refusal and choice == "cuda":
        raise RuntimeError(f"ANYFP4_KERNELS=cuda: {refusal}")
    if refusal and choice == "auto" and sm >= SOURCE_MIN_SM and found and dtype != torch.bfloat16:
        _warn_once(f"anyfp4: {refusal}; the Triton kernels run instead")  # a Volta user can fix it
    return refusal is None


@functools.cache
def _warn_once(message: str) -> None:
    import warnings

    warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclass
class Launch:
    """One kernel launch worked out from the tensors: the source's defines (``source_defines``'s and the launch's),
    grid, block threads, dynamic shared memory, the kernel's arguments in order (tensors, then integers)."""
    defines: dict
    grid: tuple
    threads: int
    shared_bytes: int
    args: list
    out: torch.Tensor


def plan_launch(fmt: str, x: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor | None,
                gscale: torch.Tensor, bias: torch.Tensor | None, n_rows: int, up_offset: int, config: MMAConfig,
                out: torch.Tensor | None, out_dtype: torch.dtype | None, *, stage_bytes: int, early: bool,
                counters: torch.Tensor | None, sm: int = ASYNC_SM, experts: ExpertPairs | None = None) -> Launch:
    """Check the inputs and work out a launch; no GPU needed (``stage_bytes``: the shared memory a block may
    stage activations in; ``counters``: the split-K arrival counters, all zero; ``sm``: the GPU's architecture,
    which picks the mma shape and the staging copies; ``experts``: a grouped expert launch's pairs, with ``x``, the
    prepack and ``out`` the first expert's and first row's, as ``plan_experts_launch`` gives them)."""
    m, k = x.shape
    if not 1 <= m <= MMA_CHUNK_ROWS:
        raise ValueError(f"the CUDA decode kernel handles 1 <= M <= {MMA_CHUNK_ROWS}, got {m}")
    if x.stride(1) != 1 or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError("x must be fp16/bf16 with a contiguous last dimension")
    c = config
    rows_total = codes.shape[0]
    k_pad = codes.shape[1] * K_PER_WORD[fmt]
    block_rows = rows_per_block(c)
    grid_x = -(-n_rows // block_rows)
    if grid_x * block_rows > (up_offset or rows_total):
        raise ValueError(f"row tile {block_rows} overruns the prepack's {up_offset or rows_total} rows")
    if bias is not None and (bias.dtype != x.dtype or bias.stride(0) != 1):
        raise ValueError("bias must be contiguous with x's dtype")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"output dtype must be {x.dtype} or float32, got {out_dtype}")
    if out_dtype != x.dtype and (bias is not None or up_offset):
        raise ValueError("a float32 output (before the scale) is for plain prepacks without bias")
    steps = k_pad // STEP_K[fmt]
    if not 1 <= config.split_k <= steps:
        raise ValueError(f"split-K {config.split_k} must be 1..{steps} for K = {k_pad}")
    refusal = k_warps_refusal(c, steps)
    if refusal:
        raise ValueError(f"{refusal} of K = {k_pad}")
    least = c.depth * STEP_K[fmt]  # the kernel stages at the start of a pass only
    kc = stage_k(m, max(0, stage_bytes - ring_bytes(c, up_offset > 0, fmt)) // c.kw, least, fmt, c.wgmma)
    slice_k = -(-steps // k_slices(c)) * STEP_K[fmt]  # the longest slice: one round covers it
    while kc // 2 >= max(least, slice_k):
        kc //= 2
    gated = up_offset > 0
    shared = shared_bytes(c, m, gated, fmt, kc)
    if shared > stage_bytes:
        raise ValueError(f"depth {c.depth} with {c.kw} K warps needs {shared} bytes of shared memory for {m} rows, "
                         f"more than the {stage_bytes} this GPU gives a block")
    bf16 = x.dtype == torch.bfloat16
    if sm < SOURCE_MIN_SM or (bf16 and sm < ASYNC_SM):
        raise ValueError(f"the CUDA decode kernel's source has variants for sm_{SOURCE_MIN_SM}+ (bf16 activations "
                         f"on sm_{ASYNC_SM}+), not sm_{sm} with {x.dtype}")
    if not fits_arch(sm, c.mt, n_tiles_for(m), gated):
        raise ValueError(f"on sm_{sm} a launch of {c.mt} m16 tiles per warp{' (gated: twice)' if gated else ''} "
                         f"for {m} rows keeps more than {QUAD_PAIR_SUMS} sums per thread: give it fewer tiles")
    if early and sm < 90 or c.shared_ring and sm < ASYNC_SM:
        raise ValueError(f"an early launch needs sm_90+, a shared ring sm_{ASYNC_SM}+ (sm_{sm}: early {early}, {c})")
    if c.wgmma not in (0, 1, 2):
        raise ValueError(f"wgmma is 0 (mma.sync), 1 or 2 (warpgroup mmas, waited for each step or a step later), "
                         f"not {c.wgmma}")
    if c.wgmma and (sm != WGMMA_SM or c.kw != 1 or c.warps % 4 or c.shared_ring or experts):
        pairs = " (expert pairs)" if experts else ""
        raise ValueError(f"warpgroup mmas (wgmma) run on sm_{WGMMA_SM} with one K warp, whole warpgroups of warps and "
                         f"a register ring, not on sm_{sm} with {c}{pairs}")
    if c.wgmma and not nvrtc.compiles_sm90a():
        raise ValueError(f"warpgroup mmas (wgmma) compile for sm_90a, which NVRTC "
                         f"{'.'.join(map(str, nvrtc.version()))} lacks (CUDA 12.0+ has it): use wgmma 0")
    if c.wgmma == 2 and c.split_k > 1:  # H100, 2026-12-07: NaN sums, different each run (results/wgmma_h100.json)
        raise ValueError(f"warpgroup mmas left in flight across steps (wgmma 2) gave wrong sums with split-K on an "
                         f"H100; use wgmma 1 or split_k 1, not {c}")
    defines = dict(source_defines(fmt, "bf16" if bf16 else "fp16"), **arch_defines(sm),
                   EARLY=int(early), SPLIT=c.split_k, OUT_F32=int(out_dtype == torch.float32), FP8=int(fmt == "fp8"),
                   NT=n_tiles_for(m), MT=c.mt, WARPS=c.warps, KW=c.kw, DEPTH=c.depth, BF16=int(bf16),
                   SHARED_RING=c.shared_ring, WGMMA=c.wgmma,
                   GATED=int(gated), HAS_BIAS=int(bias is not None), EXPERTS=int(experts is not None),
                   VEC_X=int(x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0 and k % 8 == 0))  # cp.async staging
    if out is None:
        out = torch.empty(m, n_rows, dtype=out_dtype, device=x.device)
    if out.shape != (m, n_rows) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out must be ({m}, {n_rows}) {out_dtype} with a contiguous last dimension, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if c.split_k > 1:
        if grid_x > COUNTER_SLOTS:
            raise ValueError(f"{grid_x} row tiles exceed the {COUNTER_SLOTS} split-K counters")
        partial = torch.empty(c.split_k, m, rows_total, dtype=torch.float32, device=x.device)
    else:
        partial, counters = out, out
    args = [x, codes, block_scales if block_scales is not None else codes, gscale, bias if bias is not None else out,
            out, partial, counters, m, k, n_rows, up_offset, rows_total, codes.stride(0) // 4,
            block_scales.stride(0) // 2 if block_scales is not None else 0,
            x.stride(0), out.stride(0), k_pad // STEP_K[fmt], kc]
    if experts is None:
        args += [out, 1, 0, 0, 0]  # no pairs: unused
        return Launch(defines, (grid_x, c.split_k, 1), c.warps * 32, shared, args, out)
    e = experts
    args += [e.ids, e.pairs_per_row, e.codes_stride, e.scales_stride, e.gscale_stride]
    return Launch(defines, (grid_x, 1, e.ids.shape[0]), c.warps * 32, shared, args, out)


@dataclass(frozen=True)
class ExpertPairs:
    """A grouped expert launch's pairs: ``ids`` (pairs,) int32, each one's expert; pair p reads activation row
    p // ``pairs_per_row``; one expert's prepack to the next: codes (uint4), scales (2 bytes), gscale (floats)."""
    ids: torch.Tensor
    pairs_per_row: int
    codes_stride: int
    scales_stride: int
    gscale_stride: int


def plan_experts_launch(fmt: str, x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor,
                        block_scales: torch.Tensor | None, gscale: torch.Tensor, n_rows: int, up_offset: int,
                        config: MMAConfig, out: torch.Tensor | None, *, stage_bytes: int,
                        sm: int = ASYNC_SM, early: bool = False) -> Launch:
    """A mixture of experts' grouped launch (no GPU needed): for each pair p, expert ``ids[p]``'s prepack (codes,
    NVFP4 block scales and global scales or FP8 row scales, each stacked along a leading expert dimension) over row
    ``p // (pairs / rows)`` of x (rows, K), into row p of out (pairs, n_rows). One block column per pair (grid z),
    each pair as one activation row with ``config``'s K warps and no split-K: a pair's bits are those this kernel
    gives its row with its expert alone, whatever the other pairs. ``early``: a programmatic dependent launch whose
    blocks wait for the kernel before first thing (weight_mma.cu's EXPERTS; ``ANYFP4_EXPERTS_EARLY``)."""
    pairs, rows = ids.shape[0], x.shape[0]
    if ids.dim() != 1 or ids.dtype != torch.int32 or rows == 0 or pairs % rows:
        raise ValueError(f"ids must be (pairs,) int32 with pairs a multiple of the {rows} rows of x")
    if config.split_k != 1:
        raise ValueError(f"a grouped expert launch has no split-K (got {config.split_k}): give it K warps instead")
    if out is None:
        out = torch.empty(pairs, n_rows, dtype=x.dtype, device=x.device)
    if out.shape != (pairs, n_rows) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be ({pairs}, {n_rows}) {x.dtype} with a contiguous last dimension")
    if pairs == 0:
        raise ValueError("a grouped expert launch needs at least one pair")
    nvfp4 = fmt == "nvfp4"
    pairs_of = ExpertPairs(ids, pairs // rows, codes.stride(0) // 4,
                           block_scales.stride(0) // 2 if nvfp4 else 0, gscale.stride(0))
    plan = plan_launch(fmt, x[:1], codes[0], block_scales[0] if nvfp4 else None, gscale[0:1] if nvfp4 else gscale[0],
                       None, n_rows, up_offset, config, out[:1], None, stage_bytes=stage_bytes, early=early,
                       counters=None, sm=sm, experts=pairs_of)
    return replace(plan, out=out)


def planned(fmt: str, x: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor | None,
             gscale: torch.Tensor, bias: torch.Tensor | None, n_rows: int, up_offset: int, config: MMAConfig,
             out: torch.Tensor | None, out_dtype: torch.dtype | None) -> tuple[Launch, "nvrtc.Kernel", bool]:
    """The launch of ``x``'s rows (<= MMA_CHUNK_ROWS), the loaded kernel, and whether it launches early."""
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    stage_bytes = min(STAGE_BYTES, nvrtc.max_shared_memory(device) - 1024)
    early = early_launch(device)
    counters = reserve_counters(x.device) if config.split_k > 1 else None
    plan = plan_launch(fmt, x, codes, block_scales, gscale, bias, n_rows, up_offset, config, out, out_dtype,
                       stage_bytes=stage_bytes, early=early, counters=counters, sm=device_arch(device)[0])
    return plan, nvrtc.load(source_text(), KERNEL, plan.defines, device, shared_memory=stage_bytes), early


def _launch(fmt: str, x: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor | None, gscale: torch.Tensor,
            bias: torch.Tensor | None, n_rows: int, up_offset: int, config: MMAConfig,
            out: torch.Tensor | None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``block_scales``: NVFP4's prepacked scale bytes (None for FP8); ``gscale``: NVFP4's one global scale, FP8's
    per-row scales; ``out_dtype``: x's dtype (default) or float32 (the sums unrounded)."""
    plan, kernel, early = planned(fmt, x, codes, block_scales, gscale, bias, n_rows, up_offset, config, out,
                                   out_dtype)
    kernel.launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=early)
    return plan.out


def experts_mma(fmt: str, x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor | None,
                gscale: torch.Tensor, n_rows: int, up_offset: int, config: MMAConfig) -> torch.Tensor:
    """A mixture of experts' grouped launch on the GPU (``plan_experts_launch``) -> (pairs, n_rows); early where
    ``ANYFP4_EXPERTS_EARLY`` asks for it and early launches are on."""
    from ...env import experts_early_launch

    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    stage_bytes = min(STAGE_BYTES, nvrtc.max_shared_memory(device) - 1024)
    early = early_launch(device) and experts_early_launch()
    plan = plan_experts_launch(fmt, x, ids, codes, block_scales, gscale, n_rows, up_offset, config, None,
                               stage_bytes=stage_bytes, sm=device_arch(device)[0], early=early)
    kernel = nvrtc.load(source_text(), KERNEL, plan.defines, device, shared_memory=stage_bytes)
    kernel.launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=early)
    return plan.out


def chunk_launches(x: torch.Tensor, out: torch.Tensor,
                   plan_for: Callable[[torch.Tensor, torch.Tensor], tuple[Launch, object]]
                   ) -> Iterator[tuple[Launch, object]]:
    """(launch, what ``plan_for`` gave with it) for each MMA_CHUNK_ROWS-row chunk of x (M, K), writing its rows of
    ``out`` (M, N): ``plan_for(rows, out rows)`` works a launch out once per kind of chunk (its rows, and whether
    its activations are 16-byte aligned, which the source's staging is compiled for); the other chunks of that
    kind repeat it with their own pointers. The launches, and so the bits, of one call per chunk, without its
    host work."""
    planned: dict[tuple, tuple[Launch, object, torch.Tensor, torch.Tensor]] = {}
    for i in range(0, x.shape[0], MMA_CHUNK_ROWS):
        rows, y = x[i:i + MMA_CHUNK_ROWS], out[i:i + MMA_CHUNK_ROWS]
        kind = (rows.shape[0], rows.data_ptr() % 16 == 0)
        if kind not in planned:
            planned[kind] = (*plan_for(rows, y), rows, y)
        plan, extra, rows0, y0 = planned[kind]
        if rows is not rows0:
            plan = replace(plan, args=[rows if a is rows0 else y if a is y0 else a for a in plan.args], out=y)
        yield plan, extra


def _launch_chunks(fmt: str, x: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor | None,
                   gscale: torch.Tensor, bias: torch.Tensor | None, n_rows: int, up_offset: int,
                   config_for: Callable[[int], MMAConfig], out_dtype: torch.dtype | None) -> torch.Tensor:
    """x (M, K), any M: ``_launch``'s launches for its rows MMA_CHUNK_ROWS at a time (each chunk's config
    ``config_for(its rows)``) into one (M, N) output, as ``chunk_launches`` repeats them."""
    out = torch.empty(x.shape[0], n_rows, dtype=out_dtype or x.dtype, device=x.device)

    def plan_for(rows: torch.Tensor, y: torch.Tensor):
        plan, kernel, early = planned(fmt, rows, codes, block_scales, gscale, bias, n_rows, up_offset,
                                       config_for(rows.shape[0]), y, out_dtype)
        return plan, (kernel, early)

    for plan, (kernel, early) in chunk_launches(x, out, plan_for):
        kernel.launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=early)
    return out


def nvfp4_mma_gemm(x: torch.Tensor, w, bias: torch.Tensor | None, config: MMAConfig,
                   out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """NVFP4 prepack: x (M, K), M <= MMA_CHUNK_ROWS -> (M, N); a gated prepack gives silu(gate) * up."""
    return _launch("nvfp4", x, w.codes, w.scales, w.global_scale, bias, w.out_features, w.up_offset, config, out,
                   out_dtype)


def nvfp4_mma_gemm_chunks(x: torch.Tensor, w, bias: torch.Tensor | None, config_for: Callable[[int], MMAConfig],
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """NVFP4 prepack: x (M, K), any M -> (M, N), MMA_CHUNK_ROWS rows at a time (``_launch_chunks``)."""
    return _launch_chunks("nvfp4", x, w.codes, w.scales, w.global_scale, bias, w.out_features, w.up_offset,
                          config_for, out_dtype)


def fp8_mma_gemm_chunks(x: torch.Tensor, w, bias: torch.Tensor | None, config_for: Callable[[int], MMAConfig],
                        out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """FP8 prepack: x (M, K), any M -> (M, N), MMA_CHUNK_ROWS rows at a time (``_launch_chunks``)."""
    return _launch_chunks("fp8", x, w.codes, None, w.scales, bias, w.out_features, w.up_offset, config_for,
                          out_dtype)


def fp8_mma_gemm(x: torch.Tensor, w, bias: torch.Tensor | None, config: MMAConfig,
                 out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """FP8 prepack: x (M, K), M <= MMA_CHUNK_ROWS -> (M, N); a gated prepack gives silu(gate) * up."""
    return _launch("fp8", x, w.codes, None, w.scales, bias, w.out_features, w.up_offset, config, out, out_dtype)
