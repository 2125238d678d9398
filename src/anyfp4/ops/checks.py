"""Argument checks of the ``torch.ops.anyfp4`` quantized ops: shapes, dtypes, devices and the prepack's
geometry. Shapes, dtypes and devices only: no value is read, so no check syncs with a GPU."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..packing import fp8 as fp8_packing
from ..packing import nvfp4 as nvfp4_packing
from ..packing.layout import K_ALIGN, ROW_ALIGN, round_up

ACT_DTYPES = (torch.float16, torch.bfloat16)


def check_activations(x: Tensor, in_features: int, name: str, *weights: Tensor) -> None:
    """Activation dtype and width, one device for everything, and a GPU the kernels support.
    Shapes, dtypes and devices only: no value is read, so no host sync."""
    if x.dtype not in ACT_DTYPES and not (x.device.type == "cpu" and x.dtype == torch.float32):
        raise TypeError(f"{name}: activations must be float16 or bfloat16, got {x.dtype}")
    if x.shape[-1] != in_features:
        raise ValueError(f"{name}: x has {x.shape[-1]} features, the weight expects {in_features}")
    device = x.device
    if any(t.device != device for t in weights):
        raise ValueError(f"{name}: x and the weight tensors must be on one device")
    if x.device.type == "cuda":
        from ..kernels.device import device_arch

        sm, _ = device_arch(x.device.index if x.device.index is not None else torch.cuda.current_device())
        if sm < 70:
            raise RuntimeError(f"{name}: anyfp4 kernels need compute capability 7.0 or newer, this GPU is sm_{sm}")
        if x.dtype == torch.bfloat16 and sm < 80:
            raise TypeError(f"{name}: bfloat16 activations need sm_80 or newer (this GPU is sm_{sm}); use float16")


def check_bias(bias: Optional[Tensor], x: Tensor, out_features: int, name: str) -> None:
    if bias is None:
        return
    if bias.shape != (out_features,):
        raise ValueError(f"{name}: bias must have shape ({out_features},), got {tuple(bias.shape)}")
    if bias.dtype != x.dtype or bias.device != x.device:
        raise TypeError(f"{name}: bias must be {x.dtype} on {x.device} like x, got {bias.dtype} on {bias.device}")


def check_geometry(codes: Tensor, k_per_word: int, out_features: int, in_features: int, up_offset: int,
                    name: str) -> None:
    """``out_features`` / ``in_features`` / ``up_offset`` are the ones the prepack was made for: a prepack of N x K
    holds exactly round_up(N, ROW_ALIGN) rows (twice that, gated, up from ``up_offset``) and round_up(K, K_ALIGN)
    columns, so no output column can fall into the padding."""
    if out_features <= 0 or in_features <= 0:
        raise ValueError(f"{name}: out_features and in_features must be positive, got {out_features}, {in_features}")
    if codes.dim() != 2 or codes.shape[1] * k_per_word != round_up(in_features, K_ALIGN):
        raise ValueError(f"{name}: codes {tuple(codes.shape)} are not a prepack of in_features = {in_features}")
    half = round_up(out_features, ROW_ALIGN)
    if up_offset and up_offset != half:
        raise ValueError(f"{name}: up_offset must be {half} for out_features = {out_features} (the gate half padded "
                         f"to {ROW_ALIGN} rows), got {up_offset}")
    if codes.shape[0] != (2 * half if up_offset else half):
        raise ValueError(f"{name}: codes {tuple(codes.shape)} are not a{' gated' if up_offset else ''} prepack of "
                         f"out_features = {out_features}")


def check_nvfp4(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, out_features: int, in_features: int,
           up_offset: int, name: str) -> None:
    k_per_word = nvfp4_packing.K_PER_WORD
    check_activations(x, in_features, name, codes, scales, global_scale)
    if codes.dtype != torch.int32 or codes.dim() != 2 or codes.shape[1] * k_per_word < in_features:
        raise ValueError(f"{name}: codes must be a 2-D int32 prepack covering K = {in_features}, got "
                         f"{codes.dtype} {tuple(codes.shape)}")
    check_geometry(codes, k_per_word, out_features, in_features, up_offset, name)
    rows = up_offset + out_features if up_offset else out_features
    if codes.shape[0] < rows or scales.dtype != torch.uint8 or scales.shape != (codes.shape[0], codes.shape[1] // 2):
        raise ValueError(f"{name}: scales {scales.dtype} {tuple(scales.shape)} do not match codes {tuple(codes.shape)}")
    if global_scale.dtype != torch.float32 or global_scale.numel() != 1:
        raise ValueError(f"{name}: global_scale must be one float32 value")


def check_fake_devices(name: str, x: Tensor, *tensors: Optional[Tensor]) -> None:
    """The fake (meta) implementations run whenever one input is on ``meta``: refuse a mix of devices there too,
    so weights left on ``meta`` never give an output of uninitialised memory."""
    if any(t is not None and t.device != x.device for t in tensors):
        raise ValueError(f"{name}: x and the weight tensors must be on one device, got "
                         f"{sorted({str(t.device) for t in (x, *tensors) if t is not None})}")


def check_fp8(x: Tensor, codes: Tensor, scales: Tensor, out_features: int, in_features: int, up_offset: int,
               name: str) -> None:
    k_per_word = fp8_packing.K_PER_WORD
    check_activations(x, in_features, name, codes, scales)
    rows = up_offset + out_features if up_offset else out_features
    if codes.dtype != torch.int32 or codes.dim() != 2 or codes.shape[1] * k_per_word < in_features \
            or codes.shape[0] < rows:
        raise ValueError(f"{name}: codes must be a 2-D int32 FP8 prepack covering {rows} x {in_features}, got "
                         f"{codes.dtype} {tuple(codes.shape)}")
    if scales.dtype != torch.float32 or scales.shape != (codes.shape[0],):
        raise ValueError(f"{name}: scales must be float32 ({codes.shape[0]},), got {scales.dtype} {tuple(scales.shape)}")
    check_geometry(codes, k_per_word, out_features, in_features, up_offset, name)


def check_input_scale(input_scale: Optional[Tensor], x: Tensor, name: str) -> None:
    if input_scale is not None and (input_scale.dtype != torch.float32 or input_scale.numel() != 1
                                    or input_scale.device != x.device):
        raise ValueError(f"{name}: input_scale must be one float32 value on {x.device}, got {input_scale.dtype} "
                         f"{tuple(input_scale.shape)} on {input_scale.device}")
