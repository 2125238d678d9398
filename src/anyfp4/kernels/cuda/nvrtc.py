"""Run-time compilation of CUDA C++ kernels with NVRTC, and their launch, through ctypes.

NVRTC ships with PyTorch's CUDA wheels (no CUDA toolkit needed by users) and the driver API
(libcuda) comes with the driver. A kernel is compiled once per (source, defines, GPU arch) into a
cubin, loaded into the current context and launched on the current stream, so it is captured by
CUDA graphs like any other kernel. ``available()`` says whether this machine can do it; callers
fall back to the Triton kernels when it cannot.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
from dataclasses import dataclass

import torch

from ...env import nvrtc_library

_LOCK = threading.Lock()


class NVRTCError(RuntimeError):
    pass


def _candidate_paths() -> list[str]:
    if (chosen := nvrtc_library()) is not None:  # ANYFP4_NVRTC: that library or none
        return [os.path.abspath(chosen)]
    names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    for pattern in ("nvidia/*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
        names += sorted(p for p in glob.glob(os.path.join(site, pattern)) if "builtins" not in p and ".alt." not in p)
    return names


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    errors = []
    for name in _candidate_paths():
        try:
            if os.path.isabs(name):  # NVRTC opens its builtins library by name: load it from beside first
                for builtins in glob.glob(os.path.join(os.path.dirname(name), "libnvrtc-builtins.so*")):
                    if ".alt." not in builtins:
                        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(name)
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            return lib
        except OSError as e:
            errors.append(str(e))
    if (chosen := nvrtc_library()) is not None:
        raise NVRTCError(f"ANYFP4_NVRTC={chosen}: cannot load it: {errors[0]}")
    raise NVRTCError("NVRTC (libnvrtc) was not found: " + "; ".join(errors[:3]))


@functools.cache
def _cuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise NVRTCError(f"the CUDA driver library libcuda.so.1 could not be loaded: {e}") from e


@functools.cache
def compiler_available() -> bool:
    """True when NVRTC can be loaded (enough to compile; launching needs a GPU and its driver too)."""
    try:
        _nvrtc()
        return True
    except NVRTCError:
        return False


@functools.cache
def available() -> bool:
    """True when NVRTC and the driver can be loaded (compilation errors still raise)."""
    try:
        _nvrtc()
        _cuda()
        return True
    except NVRTCError:
        return False


def _check_nvrtc(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        raise NVRTCError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(result).decode()}")


def _check_cuda(result: int, what: str) -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(result, ctypes.byref(msg))
        raise NVRTCError(f"CUDA {what} failed: {msg.value.decode() if msg.value else result}")


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version (of the library ``_nvrtc`` loaded once: asked once)."""
    lib = _nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check_nvrtc(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
    return major.value, minor.value


SM90A_MIN_VERSION = (12, 0)  # sm_90a and wgmma.mma_async (PTX ISA 8.0) came with CUDA 12.0


def compiles_sm90a() -> bool:
    """NVRTC compiles for sm_90a (warpgroup mmas): CUDA 12.0+, not the CUDA 11.8 NVRTC of torch's cu118 wheels.
    True where no NVRTC is found (then no CUDA kernel is compiled at all)."""
    return not compiler_available() or version() >= SM90A_MIN_VERSION


def compile_cubin(source: str, name: str, sm: int, defines: dict[str, int]) -> bytes:
    """Compile ``source`` for ``sm_{sm}`` with ``#define``s prepended; returns the cubin."""
    return _compile(source, name, sm, defines)[0]


def ptxas_report(source: str, name: str, sm: int, defines: dict[str, int]) -> str:
    """What ptxas says of the compiled kernel (registers, spill stores and loads, shared and stack bytes)."""
    return _compile(source, name, sm, defines, [b"--ptxas-options=-v"])[1]


def _compile(source: str, name: str, sm: int, defines: dict[str, int], extra: list[bytes] = ()) -> tuple[bytes, str]:
    lib = _nvrtc()
    text = "".join(f"#define {k} {int(v)}\n" for k, v in sorted(defines.items())) + source
    prog = ctypes.c_void_p()
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None),
                 "create")
    try:
        arch = f"sm_{sm}a" if defines.get("WGMMA") else f"sm_{sm}"  # wgmma: sm_90's architecture-specific target
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device", b"--use_fast_math",
                *extra]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if res != 0:
            raise NVRTCError(f"compiling {name} for sm_{sm} ({defines}) failed:\n{log.value.decode()}")
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        return cubin.raw, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@dataclass
class Kernel:
    """A loaded kernel: ``launch(grid, block, dynamic shared bytes, args)`` on the current CUDA stream.
    ``early=True`` (sm_90+) lets the kernel start while the previous kernel in the stream finishes
    (programmatic dependent launch); the kernel must execute ``griddepcontrol.wait`` before it reads
    anything an earlier kernel writes, or writes anything."""
    function: ctypes.c_void_p
    module: ctypes.c_void_p
    smem_limit: int = 48 * 1024  # dynamic shared memory allowed without opting in

    def allow_shared_memory(self, nbytes: int) -> None:
        """Opt in to ``nbytes`` of dynamic shared memory per block (sm_80+: up to 163-227 KiB)."""
        if nbytes > self.smem_limit:
            _check_cuda(_cuda().cuFuncSetAttribute(self.function, MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                        f"allowing {nbytes} bytes of dynamic shared memory")
            self.smem_limit = nbytes

    def blocks_per_sm(self, block: int, smem: int) -> int:
        """How many blocks of ``block`` threads and ``smem`` dynamic shared bytes a multiprocessor holds at once (its
        registers, shared memory and thread slots; the driver's occupancy calculator)."""
        self.allow_shared_memory(smem)
        blocks = ctypes.c_int()
        _check_cuda(_cuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), self.function, block,
                                                                        ctypes.c_size_t(smem)), "occupancy")
        return blocks.value

    def launch(self, grid: tuple[int, int, int], block: int, smem: int, args: list, early: bool = False) -> None:
        self.allow_shared_memory(smem)
        keep, ptrs = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                c = ctypes.c_void_p(a.data_ptr())
            elif isinstance(a, int):
                c = ctypes.c_int(a)
            else:
                raise TypeError(f"unsupported kernel argument {type(a)}")
            keep.append(c)
            ptrs.append(ctypes.addressof(c))
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        stream = torch.cuda.current_stream().cuda_stream
        if not early:
            _check_cuda(_cuda().cuLaunchKernel(self.function, grid[0], grid[1], grid[2], block, 1, 1, smem,
                                               ctypes.c_void_p(stream), arr, None), "launch")
            return
        attr = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1
        config = _LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, smem, ctypes.c_void_p(stream),
                               ctypes.pointer(attr), 1)
        _check_cuda(_cuda().cuLaunchKernelEx(ctypes.byref(config), self.function, arr, None), "launch")


_LOADED: dict[tuple, Kernel] = {}
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


@functools.cache
def max_shared_memory(device: int) -> int:
    """Bytes of shared memory one block may opt in to on ``device`` (sm_80: 163 KiB, sm_86/89: 99 KiB,
    sm_90: 227 KiB)."""
    torch.cuda.current_stream(device)  # the driver is initialised with torch's context
    dev, value = ctypes.c_int(), ctypes.c_int()
    _check_cuda(_cuda().cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check_cuda(_cuda().cuDeviceGetAttribute(ctypes.byref(value), MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                "reading the shared-memory limit")
    return value.value


def load(source: str, name: str, defines: dict[str, int], device: int, shared_memory: int = 0) -> Kernel:
    """Compile (once) and load ``name`` for ``device``'s architecture and context; ``shared_memory``: the
    most dynamic shared memory a launch of it will ask for, opted in to when it is loaded (not later, which
    could fall inside a CUDA-graph capture)."""
    props = torch.cuda.get_device_properties(device)
    sm = props.major * 10 + props.minor
    key = (hash(source), name, tuple(sorted(defines.items())), device)
    with _LOCK:
        kernel = _LOADED.get(key)
        if kernel is None:
            cubin = _compiled(source, name, sm, tuple(sorted(defines.items())))
            with torch.cuda.device(device):
                torch.cuda.current_stream()  # make sure the primary context is current
                module, function = ctypes.c_void_p(), ctypes.c_void_p()
                _check_cuda(_cuda().cuModuleLoadData(ctypes.byref(module), cubin), f"loading {name}")
                _check_cuda(_cuda().cuModuleGetFunction(ctypes.byref(function), module, name.encode()),
                            f"finding {name}")
            kernel = _LOADED[key] = Kernel(function, module)
            kernel.allow_shared_memory(shared_memory)
    return kernel


@functools.cache
def _compiled(source: str, name: str, sm: int, defines: tuple) -> bytes:
    return compile_cubin(source, name, sm, dict(defines))
