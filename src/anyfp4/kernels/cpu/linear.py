"""Quantized linears on the CPU at CPU speed: ``cpu/weight_cpu.c`` reads the GPU prepacks as they are.

The C source is compiled at first use by the system C compiler (``$CC``, else ``cc`` / ``gcc``) for this
machine (``-march=native``) and cached under ``anyfp4``'s cache directory, keyed by the source, the flags,
the compiler's version and the CPU; without a compiler the ops fall back to the pure-torch reference (with
one warning). The layout reaches the C code as defines (``weight_cpu_defines``, from the formats' bit tables)
and strides computed here from ``packing/layout.py``'s offset functions, so the packing modules stay its only
owner.

The output rows of a call are split between threads (``torch.get_num_threads()`` of them, at most one per
CPU this process may run on); each thread runs the C function on its rows with the GIL released (ctypes).
Every output row is one fixed sequence of float32 operations, so its bits depend neither on the other rows
of x in the call nor on the threads.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch

from ...packing.fp8 import FP8Prepacked
from ...packing.layout import (TILE_BLOCKS, TILE_ROWS, TILE_WORDS, WORDS_PER_BLOCK, tiled_scale_offset,
                               tiled_word_offset)
from ...packing.nvfp4 import NVFP4Prepacked
from .weight_cpu_defines import layout_defines

SOURCE = Path(__file__).with_name("weight_cpu.c")
# Multiply-adds per thread below which another thread costs more than it saves: handing work to a Python thread
# and back costs ~60-200 us on a 2-CPU VM (a 960x576 M = 1 call: 89 us on one thread, 241 us on two; 4096x1024:
# 346 vs 428; 4096x4096: 2303 vs 1044).
MIN_THREAD_WORK = 1 << 22
_FLAGS = ("-O3", "-ffp-contract=fast", "-fno-math-errno", "-std=c11", "-shared", "-fPIC")
_ARCH_FLAGS = (("-march=native",), ("-mcpu=native",))  # the first the compiler takes, else none


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpuinfo_line(prefixes: tuple[str, ...]) -> str | None:
    """The first /proc/cpuinfo line starting with one of ``prefixes``: "" if none does, None without the file."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(prefixes)), "")
    except OSError:
        return None


def _cpu_signature() -> str:
    line = _cpuinfo_line(("flags", "Features"))
    return platform.processor() if line is None else line


def cpu_model() -> str:
    """The CPU's model name (benchmarks record it: the kernels' paths differ by CPU), else the machine type."""
    line = _cpuinfo_line(("model name",))
    return line.split(":", 1)[1].strip() if line else platform.processor() or platform.machine()


def _arch_flags(cc: str) -> tuple[str, ...]:
    """The first of ``_ARCH_FLAGS`` the compiler takes (x86: -march=native, Arm: -mcpu=native)."""
    for flags in _ARCH_FLAGS:
        probe = subprocess.run([cc, *flags, "-E", "-x", "c", os.devnull], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return flags
    return ()


def _build(cc: str, out_dir: Path, extra: tuple[str, ...] = (), source_file: Path | None = None) -> Path:
    """Compile the source into ``out_dir`` (atomically renamed into place); returns the shared library.
    ``extra``: more flags (the tests build ``-DWEIGHT_CPU_PORTABLE``, the plain-C path, too); ``source_file``:
    another revision of ``weight_cpu.c`` (a benchmark's before and after)."""
    source_file = source_file or SOURCE
    source = source_file.read_text()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    flags = [*_FLAGS, *_arch_flags(cc), *layout_defines(), *extra]
    key = hashlib.sha256("\0".join([source, version, _cpu_signature(), platform.machine(), *flags]).encode())
    lib = out_dir / f"weight_cpu-{key.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        run = subprocess.run([cc, *flags, str(source_file), "-o", tmp], capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
            raise OSError(f"{cc} could not compile {source_file.name}: {last}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def open_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.nvfp4_linear_rows.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64, i64,
                                      i64, i64, f32, ptr, i64]
    lib.fp8_linear_rows.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, ptr, i64]
    lib.dense_linear_rows.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, i64, i64, i64, ptr, i64]
    lib.nvfp4_linear_rows.restype = lib.fp8_linear_rows.restype = lib.dense_linear_rows.restype = ctypes.c_int
    lib.weight_cpu_features.argtypes, lib.weight_cpu_features.restype = [], ctypes.c_int64
    return lib


def features(lib) -> dict[str, bool]:
    """What a build of the kernels computes with: the AVX-512 kernels, the bf16 dot products that NVFP4 and FP8
    layers take for bf16 activations (CPUs with AVX512_BF16), and AMX tiles, which take them instead where the CPU
    has them and the system grants them."""
    bits = lib.weight_cpu_features()
    return {"avx512": bool(bits & 1), "bf16_dot_products": bool(bits & 2), "amx_tiles": bool(bits & 4)}


@functools.lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | OSError:
    """The compiled kernels, or the reason they cannot be built (kept, so a failed build is tried once)."""
    from ...env import cache_dir

    cc = _compiler()
    try:
        if cc is None:
            raise OSError("no C compiler found (install gcc or set CC)")
        return open_library(_build(cc, cache_dir() / "cpu-kernels"))
    except (OSError, subprocess.SubprocessError) as e:
        return e if isinstance(e, OSError) else OSError(str(e))


def library() -> ctypes.CDLL | None:
    """The C kernels, or None where ``ANYFP4_CPU_KERNELS=reference`` or no compiler builds them (warned once;
    ``ANYFP4_CPU_KERNELS=c`` makes that an error)."""
    from ...env import cpu_kernels

    mode = cpu_kernels()
    if mode == "reference":
        return None
    lib = _load()
    if isinstance(lib, OSError):
        if mode == "c":
            raise lib
        _warn_unavailable(str(lib))
        return None
    return lib


@functools.lru_cache(maxsize=1)
def _warn_unavailable(reason: str) -> None:
    warnings.warn(f"anyfp4: the CPU kernels are not available ({reason}); quantized linears on the CPU use the "
                  f"much slower pure-torch reference", stacklevel=3)


@functools.lru_cache(maxsize=1)
def cgroup_cpu_quota() -> int | None:
    """The CPUs a cgroup v2 CPU quota allows (a container's ``--cpus``), None without one; read once (every linear
    call asks, and the file read cost more than a small layer's arithmetic)."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, int(quota) // int(period))
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota, which the affinity
    does not show."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return cpus if quota is None else min(cpus, quota)


def threads() -> int:
    """Threads for one call: torch's intra-op count, at most one per CPU this process may run on."""
    return max(1, min(torch.get_num_threads(), available_cpus()))


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="anyfp4-cpu")


def _run_split(run, ranges: list[tuple[int, int]], work_per_row: int) -> None:
    """``run(n0, n1)`` over every range, the ranges cut at row-block boundaries and shared between threads
    (no more threads than there are ``MIN_THREAD_WORK`` multiply-adds for)."""
    total = sum(b - a for a, b in ranges)
    if total * work_per_row < 2 * MIN_THREAD_WORK:  # one thread's work (most decode calls): no thread asked for
        for a, b in ranges:
            run(a, b)
        return
    parts = min(threads(), total * work_per_row // MIN_THREAD_WORK)
    share = -(-total // parts // TILE_ROWS) * TILE_ROWS if parts > 1 else total
    pieces = []
    for a, b in ranges:
        for n0 in range(a, b, max(share, TILE_ROWS)):
            pieces.append((n0, min(b, n0 + max(share, TILE_ROWS))))
    if len(pieces) == 1 or parts == 1:
        for piece in pieces:
            run(*piece)
        return
    futures = [_pool().submit(run, *piece) for piece in pieces[1:]]
    try:
        run(*pieces[0])
    finally:  # the C calls read the caller's tensors: none may still run when this returns (or raises)
        wait(futures)
    for f in futures:
        f.result()


# x's dtypes as weight_cpu.c's X_FLOAT32 / X_BFLOAT16 / X_FLOAT16 (it widens them to float32 exactly)
X_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _activations(x2: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x as the C functions read it (unit stride along k, one of ``X_DTYPES``) and its dtype's code."""
    if x2.dtype not in X_DTYPES:
        x2 = x2.float()
    if x2.stride(1) != 1 and x2.shape[1] > 1:
        x2 = x2.contiguous()
    return x2, X_DTYPES[x2.dtype]


def tiles_with_k(k: int, fields: int) -> int:
    """The tiles of a row that hold some of its k (the rest of the prepack's row is padding)."""
    return -(-k // (TILE_WORDS * fields))


def _checked(status: int) -> None:
    if status != 0:
        raise MemoryError("anyfp4: the CPU kernel could not allocate its copy of the activations")


@functools.lru_cache(maxsize=None)
def _nvfp4_strides(words_per_row: int, blocks_per_row: int) -> tuple:
    """(per tile row: the aligned 16 bytes of the tile that hold its block scales, and each lane's byte in them;
    word stride per row block / row / tile, scale stride per row block / tile), from the prepack's offset
    functions."""
    if any(tiled_word_offset(r, j, words_per_row) != r * TILE_WORDS + j for r in range(TILE_ROWS)
           for j in range(TILE_WORDS)):
        raise AssertionError("weight_cpu.c reads tile rows of TILE_WORDS consecutive words")
    inside = torch.tensor([[tiled_scale_offset(r, b, blocks_per_row) for b in range(TILE_BLOCKS)]
                           for r in range(TILE_ROWS)], dtype=torch.int64)
    if (inside // 16 != inside[:, :1] // 16).any() or inside.max() >= TILE_ROWS * TILE_BLOCKS:
        raise AssertionError("weight_cpu.c reads a row's block scales from one aligned 16 bytes of its tile")
    spans = inside[:, 0] // 16 * 16
    lane_bytes = (inside[:, torch.arange(TILE_WORDS) // WORDS_PER_BLOCK] - spans[:, None]).to(torch.uint8)
    return (spans.contiguous(), lane_bytes.contiguous(), tiled_word_offset(TILE_ROWS, 0, words_per_row), TILE_WORDS,
            tiled_word_offset(0, TILE_WORDS, words_per_row), tiled_scale_offset(TILE_ROWS, 0, blocks_per_row),
            tiled_scale_offset(0, TILE_BLOCKS, blocks_per_row))


def output_rows(m: int, w, row_starts: tuple[int, ...]) -> torch.Tensor:
    """What the C functions write into: column n gets weight row n. One start at row 0 (a plain prepack) needs only
    its ``out_features`` columns, which are then the result as they are; otherwise every prepack row's."""
    return torch.empty(m, w.out_features if row_starts == (0,) else w.codes.shape[0], dtype=torch.float32)


def joined(y: torch.Tensor, row_starts: tuple[int, ...], n: int) -> torch.Tensor:
    """The ``n`` columns from each start of ``output_rows``' result, side by side."""
    if row_starts == (0,) and y.shape[1] == n:
        return y
    return torch.cat([y[:, s:s + n] for s in row_starts], dim=1)


def nvfp4_rows(lib, x2: torch.Tensor, w: NVFP4Prepacked, row_starts: tuple[int, ...], global_scale: float | None):
    """float32 (M, len(row_starts) * N): ``x @ W^T`` for the N weight rows from each start (0, or ``up_offset``
    for the up half of a gated prepack), times ``global_scale`` (None: the sums before it)."""
    m, k = x2.shape
    x2, x_dtype = _activations(x2)
    words = w.codes.shape[1]
    codes, scales = w.codes.contiguous(), w.scales.contiguous()  # the C code reads them as dense row-major
    spans, lane_bytes, *strides = _nvfp4_strides(words, words // 2)
    y = output_rows(m, w, row_starts)
    out_scale = 1.0 if global_scale is None else global_scale
    args = (codes.data_ptr(), scales.data_ptr(), x2.data_ptr(), x_dtype, x2.stride(0), k, m, spans.data_ptr(),
            lane_bytes.data_ptr(), tiles_with_k(k, 8), *strides)
    _run_split(lambda n0, n1: _checked(lib.nvfp4_linear_rows(*args, n0, n1, out_scale, y.data_ptr(), y.shape[1])),
               [(s, s + w.out_features) for s in row_starts], m * w.in_features)
    return joined(y, row_starts, w.out_features)


def fp8_rows(lib, x2: torch.Tensor, w: FP8Prepacked, row_starts: tuple[int, ...], scaled: bool):
    """float32 (M, len(row_starts) * N): ``x @ W^T`` for the N rows from each start, times the row scales
    (``scaled``) or before them."""
    m, k = x2.shape
    x2, x_dtype = _activations(x2)
    words = w.codes.shape[1]
    codes, row_scales = w.codes.contiguous(), w.scales.contiguous()  # the C code reads them as dense
    y = output_rows(m, w, row_starts)
    scales = row_scales.data_ptr() if scaled else None
    args = (codes.data_ptr(), scales, x2.data_ptr(), x_dtype, x2.stride(0), k, m, tiles_with_k(k, 4),
            tiled_word_offset(TILE_ROWS, 0, words), TILE_WORDS, tiled_word_offset(0, TILE_WORDS, words))
    _run_split(lambda n0, n1: _checked(lib.fp8_linear_rows(*args, n0, n1, y.data_ptr(), y.shape[1])),
               [(s, s + w.out_features) for s in row_starts], m * w.in_features)
    return joined(y, row_starts, w.out_features)


# a dense weight's dtypes as weight_cpu.c's W_FLOAT32 / W_BFLOAT16
W_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def dense_rows(lib, x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 (M, N): ``x @ W^T`` for a dense float32 / bf16 weight (N, K), each row one fixed sequence of sums
    (weight_cpu.c), so its bits do not depend on M."""
    if weight.dtype not in W_DTYPES or weight.stride(1) != 1:
        raise ValueError(f"dense_rows: the weight must be float32 or bfloat16 with unit stride along k, got "
                         f"{weight.dtype} strides {weight.stride()}")
    m, k = x2.shape
    x2, x_dtype = _activations(x2)
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    args = (weight.data_ptr(), W_DTYPES[weight.dtype], weight.stride(0), x2.data_ptr(), x_dtype, x2.stride(0), k, m)
    _run_split(lambda n0, n1: _checked(lib.dense_linear_rows(*args, n0, n1, y.data_ptr(), n)), [(0, n)], m * k)
    return y


def linear_on_rows(x: torch.Tensor, w: NVFP4Prepacked | FP8Prepacked, bias: torch.Tensor | None, partial: bool,
                   rows) -> torch.Tensor:
    """An op's result from ``rows(x2, row_starts, scaled)`` (``nvfp4_rows`` / ``fp8_rows`` bound to a weight):
    ``partial``: the float32 sums before the weight's scale; gated: ``silu(gate) * up``; else plus ``bias``,
    rounded to x's dtype."""
    x2 = x.reshape(-1, w.in_features)
    shape = (*x.shape[:-1], w.out_features)
    if partial:
        return rows(x2, (0,), False).reshape(shape)
    if w.gated:
        gate, up = rows(x2, (0, w.up_offset), True).split(w.out_features, dim=1)
        # silu row by row: over the whole (M, N) gate torch's vector loop (and its threads) would cut rows at
        # positions that depend on M, and the elements past the last full vector take another exp
        y = torch.stack([torch.nn.functional.silu(g) for g in gate.unbind()]) * up if gate.shape[0] > 1 \
            else torch.nn.functional.silu(gate) * up
    else:
        y = rows(x2, (0,), True)
        if bias is not None:
            y = y + bias.float()
    y = y.to(x.dtype)
    return y if y.shape == shape else y.reshape(shape)
