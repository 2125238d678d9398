"""Every environment variable anyfp4 reads, in one place (documented in README.md)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted demo checkpoints live: ``$ANYFP4_CACHE``, else ``$XDG_CACHE_HOME/anyfp4``, else ~/.cache/anyfp4."""
    explicit = os.environ.get("ANYFP4_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "anyfp4"


def debug_tracebacks() -> bool:
    """``ANYFP4_DEBUG=1``: the command line prints an error's traceback before its one-line message (as
    ``anyfp4 --debug`` does). Anything else, or unset: the message alone."""
    return os.environ.get("ANYFP4_DEBUG", "0").strip() == "1"


def triton_interpret() -> bool:
    """Triton's CPU interpreter (``TRITON_INTERPRET=1``): kernels run on CPU tensors, slowly."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The value of ``name`` (trimmed, lower case), ``default`` when unset; anything not in ``choices`` is an
    error naming the variable."""
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


ACT_PACK_CHOICES = ("auto", "0", "1")


def act_pack_mode() -> str:
    """``ANYFP4_ACT_PACK``: ``auto`` (by GPU and M, the default), ``0`` (never) or ``1`` (always).

    Read inside the custom op at call time, so it never changes what torch.compile traces.
    """
    return _choice("ANYFP4_ACT_PACK", ACT_PACK_CHOICES, "auto")


KERNEL_CHOICES = ("auto", "cuda", "triton")


def kernel_choice() -> str:
    """``ANYFP4_KERNELS``: which decode kernels serve M <= 32 on the GPU. ``auto`` (default): the CUDA
    tensor-core kernels (compiled at run time by NVRTC) on sm_80+ when NVRTC is found, the Triton kernels
    otherwise; ``cuda``: the CUDA kernels or an error; ``triton``: always the Triton kernels.

    Read inside the custom ops at call time, so it never changes what torch.compile traces.
    """
    return _choice("ANYFP4_KERNELS", KERNEL_CHOICES, "auto")


CPU_KERNEL_CHOICES = ("auto", "c", "reference")


def cpu_kernels() -> str:
    """``ANYFP4_CPU_KERNELS``: quantized linears on the CPU. ``auto`` (default): the C kernels
    (``kernels/cpu/linear.py``, compiled at first use) where a C compiler builds them, else the pure-torch
    reference with a warning; ``c``: the C kernels or an error; ``reference``: always the reference."""
    return _choice("ANYFP4_CPU_KERNELS", CPU_KERNEL_CHOICES, "auto")


PREFILL_MODES = ("auto", "cublas", "chunked", "fused")


def prefill_mode() -> str:
    """``ANYFP4_PREFILL``: how quantized linears run more than 32 rows on a GPU. ``auto`` (default): by the call's
    rows and the weight's shape (``dispatch.policy.auto_prefill_kernel``); ``cublas``: dequantize, then cuBLAS;
    ``chunked``: the decode kernels, 64 rows at a time (sm_80+), and float layers of at most 256 outputs through
    their decode GEMV, and the runner's prompts as captured decode steps of 32 // rows tokens per row
    (``runtime.prompt``) — slower for long prompts, but a row's bits then depend neither on the prompt's length nor
    on the other prompts of a batch nor, with two tensor-parallel ranks, on the split over GPUs; ``fused`` (NVFP4):
    one Triton GEMM decoding the weight tiles in registers, no dense copy of the weight. Read inside the op."""
    return _choice("ANYFP4_PREFILL", PREFILL_MODES, "auto")


GDN_PREFILL_MODES = ("torch", "recurrent", "chunked")


def gdn_prefill_mode() -> str:
    """``ANYFP4_GDN_PREFILL``: how a Gated DeltaNet layer runs a prompt of more than 32 tokens on a GPU.
    ``recurrent`` (default): the step kernels through every token (a prefill then gives the bits of decode steps;
    4.5-8x ``torch`` from 128 to 8192 tokens on an H100, ``benchmarks/results/gdn_prefill_h100.json``);
    ``torch``: the pure-torch chunked form (matrix products per chunk of 64, a chain of small launches);
    ``chunked``: the Triton chunked kernels (all chunks' triangular solves at once, then one pass over the chunks;
    0.9-1.8x ``torch`` in the same run). Read inside the op."""
    return _choice("ANYFP4_GDN_PREFILL", GDN_PREFILL_MODES, "recurrent")


FP8_PREFILL_MODES = ("weight-only", "w8a8")


def fp8_prefill_mode() -> str:
    """``ANYFP4_FP8_PREFILL``: how FP8 linears run more than 32 rows. ``weight-only`` (default): the FP8 weight
    dequantized, cuBLAS in the activation dtype (the more accurate); ``w8a8``: the activations quantized to FP8
    with the checkpoint's static ``input_scale`` and one ``torch._scaled_mm`` on FP8 tensor cores (sm_89+ GPUs,
    and the CPU) — faster prefill, FP8 rounding of the activations. Layers without an input scale, GPUs below
    sm_89 and ``ANYFP4_PREFILL=chunked`` stay weight-only. Read inside the op."""
    return _choice("ANYFP4_FP8_PREFILL", FP8_PREFILL_MODES, "weight-only")


def extra_mma_table_path() -> str | None:
    """``ANYFP4_MMA_TABLE``: an output file of ``benchmarks/probes/mma_sweep.py`` whose best launch configs
    take precedence over the built-in launch table of the CUDA decode kernels (tuning on your own GPU)."""
    value = os.environ.get("ANYFP4_MMA_TABLE", "").strip()
    return value or None


def nvrtc_library() -> str | None:
    """``ANYFP4_NVRTC``: the NVRTC library the CUDA kernels compile with (a path to ``libnvrtc.so.*``), instead of
    the first one found. CUDA 13's NVRTC no longer compiles for sm_70 (Volta): point this at CUDA 12's."""
    value = os.environ.get("ANYFP4_NVRTC", "").strip()
    return value or None


def early_launch_allowed() -> bool:
    """``ANYFP4_EARLY_LAUNCH``: ``1`` (default) launches the CUDA decode kernels and the Triton glue kernels of a
    decode step on sm_90+ as programmatic dependent launches (each is resident, and a decode kernel loads its first
    weights, while the previous kernel finishes); ``0`` turns it off."""
    return _choice("ANYFP4_EARLY_LAUNCH", ("0", "1"), "1") == "1"


def experts_early_launch() -> bool:
    """``ANYFP4_EXPERTS_EARLY``: ``1`` launches a mixture of experts' grouped expert launches early too (where
    ``ANYFP4_EARLY_LAUNCH`` allows early launches), each block waiting for the routing before it reads anything —
    its expert ids choose the weights it reads; ``0`` (default: on an H100 it gained nothing, benchmarks/NOTES.md)
    launches them in stream order. Outputs are bit-identical either way."""
    return _choice("ANYFP4_EXPERTS_EARLY", ("0", "1"), "0") == "1"


TP_ALLREDUCE_CHOICES = ("auto", "peer", "nccl")


def tp_allreduce() -> str:
    """``ANYFP4_TP_ALLREDUCE``: how tensor-parallel ranks on GPUs sum the row-parallel outputs of decode steps.
    ``auto`` (default): through peer memory (PyTorch symmetric memory) where it works, NCCL otherwise;
    ``peer``: peer memory or an error; ``nccl``: always NCCL. Prefill-sized sums always use NCCL."""
    return _choice("ANYFP4_TP_ALLREDUCE", TP_ALLREDUCE_CHOICES, "auto")


TP_LM_HEAD_CHOICES = ("replicated", "vocab")


def tp_lm_head() -> str:
    """``ANYFP4_TP_LM_HEAD``: the lm_head of a tensor-parallel model. ``replicated`` (default): every rank
    computes all logits; ``vocab``: each rank computes the logits of its 1/tp of the vocabulary (reading 1/tp
    of the lm_head) and the ranks all-gather them."""
    return _choice("ANYFP4_TP_LM_HEAD", TP_LM_HEAD_CHOICES, "replicated")


def vllm_auto() -> bool:
    """``ANYFP4_VLLM_AUTO=1``: the vLLM plugin claims supported checkpoints without ``quantization="anyfp4"``
    when the GPU has no native kernels for their format (NVFP4 below sm_100, FP8 below sm_89) or vLLM
    runs on the CPU. Off by default."""
    return os.environ.get("ANYFP4_VLLM_AUTO", "0").strip() == "1"


def serve_api_key() -> str | None:
    """``ANYFP4_API_KEY``: the key ``anyfp4 serve`` requires (``Authorization: Bearer KEY`` on every route but
    ``/health``) when ``--api-key`` is not given. Surrounding whitespace is dropped; unset or empty: no key."""
    value = os.environ.get("ANYFP4_API_KEY", "").strip()
    return value or None
