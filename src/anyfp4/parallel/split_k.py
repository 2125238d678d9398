"""Split-K of a tensor-parallel rank's quantized layers: each shard gets its full layer's split on one GPU,
so that the ranks' float32 shares add up to one GPU's sums bit for bit."""

from __future__ import annotations

from torch import nn

from ..nn.linear import FP8Linear, NVFP4Linear


def _single_gpu_split(layer: nn.Module, n: int, k: int, gated: bool) -> int:
    """The split-K one GPU uses for the full ``n`` x ``k`` layer (the launch table's, from M = 1)."""
    from ..packing.nvfp4 import K_ALIGN, _round_up
    from ..dispatch.tuning import mma_config
    from ..kernels.device import device_arch

    sm, sms = device_arch(layer.codes.device.index)
    fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
    return mma_config(sm, sms, fmt, gated, n, k, _round_up(k, K_ALIGN), 1).split_k


def match_single_gpu_splits(model: nn.Module, tp: int) -> None:
    """Give each quantized shard the split-K of its full layer on one GPU: a column-parallel rank (a slice of
    the rows) the full layer's, a row-parallel rank (a slice of K) the full layer's divided by ``tp``. A
    rank's rows then add up their k in the order one GPU does; with two ranks and an even split, one GPU
    sums each half of its slices as a rank sums its own before adding the halves (``sum_slices`` in
    ``cuda/weight_mma.cu``), so the ranks' float32 shares summed give one GPU's sum bit for bit."""
    if model.device.type != "cuda":  # before the GPU-only imports (tuning needs Triton)
        return
    from ..kernels.cuda import weight_mma
    from ..packing.nvfp4 import K_ALIGN, _round_up
    from ..kernels.device import device_arch

    if not weight_mma.enabled(device_arch(model.device.index)[0]):
        return
    quantized = (NVFP4Linear, FP8Linear)
    for blk in model.blocks:
        qkv = blk.attn.qkv if isinstance(blk.attn.qkv, nn.ModuleList) else [blk.attn.qkv]
        column = [(m, False) for m in qkv] + [(blk.mlp.gated, True)] + [(m, False) for m in (
            blk.mlp.gate_up, blk.mlp.gate, blk.mlp.up)]
        for layer, gated in column:
            if isinstance(layer, quantized):
                layer.split_k = _single_gpu_split(layer, layer.out_features * tp, layer.in_features, gated)
        for layer in (blk.attn.o_proj, blk.mlp.down):
            if not isinstance(layer, quantized):
                continue
            full_k = layer.in_features * tp
            split = _single_gpu_split(layer, layer.out_features, full_k, False)
            step = weight_mma.STEP_K["nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"]
            if split % tp == 0 and (_round_up(full_k, K_ALIGN) // step) % tp == 0:  # else: close, not the same bits
                layer.split_k = split // tp
