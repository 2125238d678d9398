"""The CUDA decode kernel (``kernels/cuda/weight_mma.cu``) run on the CPU: its source, after a launch's defines and
``host_cuda.h``, compiled by the host C++ compiler into a small library (cached per set of defines); launched with
the arguments the real launcher works out (``weight_mma.plan_launch``) on CPU tensors."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from anyfp4.kernels.cuda import weight_mma, weight_mma_geometry

HEADER = Path(__file__).with_name("host_cuda.h")
N_POINTERS, N_INTS = 9, 15  # anyfp4_weight_mma's parameters (pointers and ints in the launch's argument order)
LAUNCH = """
static void* host_ptrs[9];
static int host_ints[15];
static void host_body() {
    const int* i = host_ints;
    anyfp4_weight_mma((const u16*)host_ptrs[0], (const uint4*)host_ptrs[1], (const u16*)host_ptrs[2],
                      (const float*)host_ptrs[3], (const u16*)host_ptrs[4], host_ptrs[5], (float*)host_ptrs[6],
                      (int*)host_ptrs[7], i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10],
                      (const int*)host_ptrs[8], i[11], i[12], i[13], i[14]);
}
extern "C" int host_launch(int gx, int gy, int gz, int threads, void** ptrs, const int* ints, char* err, int errlen) {
    for (int k = 0; k < 9; ++k) host_ptrs[k] = ptrs[k];
    for (int k = 0; k < 15; ++k) host_ints[k] = ints[k];
    return host::run_grid(gx, gy, gz, threads, host_body, err, errlen);
}
"""


def available() -> bool:
    return shutil.which("g++") is not None


@functools.cache
def _library(defines: tuple) -> ctypes.CDLL:
    source = "".join(f"#define {k} {v}\n" for k, v in defines) + f'#include "{HEADER}"\n'
    source += weight_mma.source_text() + LAUNCH
    digest = hashlib.sha256((source + HEADER.read_text()).encode()).hexdigest()[:16]
    build = Path(tempfile.gettempdir()) / "anyfp4-host-cuda"
    build.mkdir(exist_ok=True)
    lib = build / f"weight_mma_{digest}.so"
    if not lib.exists():
        src = build / f"weight_mma_{digest}.cpp"
        src.write_text(source)
        tmp = lib.with_suffix(f".{id(source)}.tmp")
        done = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"host build of weight_mma.cu failed ({dict(defines)}):\n{done.stderr[-4000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


def run(plan: weight_mma.Launch) -> torch.Tensor:
    """Run a planned launch (CPU tensors, no early launch) and return its output."""
    assert plan.defines["EARLY"] == 0, "the host build has no programmatic dependent launch"
    tensors = [a for a in plan.args if isinstance(a, torch.Tensor)]
    ints = [a for a in plan.args if not isinstance(a, torch.Tensor)]
    assert len(tensors) == N_POINTERS and len(ints) == N_INTS and all(t.device.type == "cpu" for t in tensors)
    lib = _library(tuple(sorted(plan.defines.items())))
    pointers = (ctypes.c_void_p * N_POINTERS)(*[t.data_ptr() for t in tensors])
    values = (ctypes.c_int * N_INTS)(*ints)
    err = ctypes.create_string_buffer(512)
    if lib.host_launch(plan.grid[0], plan.grid[1], plan.grid[2], plan.threads, pointers, values, err, len(err)):
        raise RuntimeError(f"weight_mma.cu on the host: {err.value.decode()}")
    return plan.out


def gemm(fmt: str, tight: bool = False, sm: int = weight_mma.ASYNC_SM):
    """A CPU stand-in for ``nvfp4_mma_gemm`` / ``fp8_mma_gemm`` (same arguments) that runs the kernel's source;
    ``tight``: give a block only the shared memory of one pass over its ring (for each K warp; or what its K warps
    meet in, where more), so it stages activations every pass (else the H200's ``STAGE_BYTES``); ``sm``: the
    architecture's variant (75: two m16n8k8 mmas per product, staging through registers). Checks that the split-K
    counters are left at zero."""

    def call(x, p, bias, config, out=None, out_dtype=None):
        counters = torch.zeros(1024, dtype=torch.int32)
        stage_bytes = (weight_mma_geometry.least_shared_bytes(config, x.shape[0], p.up_offset > 0, fmt) if tight
                       else weight_mma.STAGE_BYTES)
        scales, gscale = (p.scales, p.global_scale) if fmt == "nvfp4" else (None, p.scales)
        plan = weight_mma.plan_launch(fmt, x, p.codes, scales, gscale, bias, p.out_features, p.up_offset, config,
                                      out, out_dtype, stage_bytes=stage_bytes, early=False, counters=counters,
                                      sm=sm)
        y = run(plan)
        assert not counters.any(), "split-K counters not reset"
        return y

    return call


def gemm_chunks(fmt: str, sm: int = weight_mma.ASYNC_SM):
    """A CPU stand-in for ``nvfp4_mma_gemm_chunks`` / ``fp8_mma_gemm_chunks`` (same arguments): the launches
    ``weight_mma.chunk_launches`` repeats over the chunks, each run by the kernel's source as ``gemm`` runs one."""

    def call(x, p, bias, config_for, out_dtype=None):
        counters = torch.zeros(1024, dtype=torch.int32)
        scales, gscale = (p.scales, p.global_scale) if fmt == "nvfp4" else (None, p.scales)
        out = torch.empty(x.shape[0], p.out_features, dtype=out_dtype or x.dtype)

        def plan_for(rows, y):
            return weight_mma.plan_launch(fmt, rows, p.codes, scales, gscale, bias, p.out_features, p.up_offset,
                                          config_for(rows.shape[0]), y, out_dtype, stage_bytes=weight_mma.STAGE_BYTES,
                                          early=False, counters=counters, sm=sm), None

        for plan, _ in weight_mma.chunk_launches(x, out, plan_for):
            run(plan)
        assert not counters.any(), "split-K counters not reset"
        return out

    return call
