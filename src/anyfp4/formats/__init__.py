"""Pure-torch reference of the number and weight formats (the spec kernels are tested against)."""

from .fp8 import E4M3_MAX, FP8Weight, dequantize_fp8, e4m3_decode, e4m3_encode, fp8_weight_scale, quantize_fp8
from .nvfp4 import (
    GROUP_SIZE,
    NVFP4Weight,
    dequantize_nvfp4,
    e2m1_decode,
    e2m1_encode,
    e2m1_values,
    nvfp4_block_scales,
    nvfp4_global_scale,
    pack_nibbles,
    quantize_nvfp4,
    shared_global_scale,
    unpack_nibbles,
)

__all__ = [
    "E4M3_MAX",
    "FP8Weight",
    "GROUP_SIZE",
    "NVFP4Weight",
    "dequantize_fp8",
    "dequantize_nvfp4",
    "e2m1_decode",
    "e2m1_encode",
    "e2m1_values",
    "e4m3_decode",
    "e4m3_encode",
    "fp8_weight_scale",
    "nvfp4_block_scales",
    "nvfp4_global_scale",
    "pack_nibbles",
    "quantize_fp8",
    "quantize_nvfp4",
    "shared_global_scale",
    "unpack_nibbles",
]
