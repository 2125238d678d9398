"""dispatch/policy.py: which kernel runs a quantized linear, as a table of plain inputs (device sm, M, format,
switches) and the kernel each gets — NVFP4 and FP8 from one function, nothing read from the environment."""

import pytest

from anyfp4.dispatch.policy import Choice, Kernel, act_pack_auto, choose_kernel

K = Kernel
W8A8_OFF_HERE = ("ANYFP4_FP8_PREFILL=w8a8 needs FP8 tensor cores (sm_89+); FP8 prefill stays weight-only here")

# (format, M, sm or None for the CPU, facts) -> (kernel, act_pack, warning)
CASES = [
    # the CPU: the C kernels / reference, W8A8 where asked for and possible
    ("nvfp4", 1, None, {}, K.CPU),
    ("nvfp4", 100, None, dict(prefill="chunked"), K.CPU),
    ("fp8", 40, None, dict(fp8_prefill="w8a8", has_input_scale=True), K.W8A8_SCALED_MM),
    ("fp8", 40, None, dict(fp8_prefill="w8a8", has_input_scale=True, prefill="chunked"), K.W8A8_SCALED_MM),
    ("fp8", 32, None, dict(fp8_prefill="w8a8", has_input_scale=True), K.CPU),  # decode-sized
    ("fp8", 40, None, dict(fp8_prefill="w8a8"), K.CPU),  # no input scale
    ("fp8", 40, None, dict(fp8_prefill="w8a8", has_input_scale=True, partial=True), K.CPU),  # a share
    ("fp8", 40, None, dict(has_input_scale=True), K.CPU),  # weight-only (the default)
    # sm_80+ with the CUDA kernel: decode-sized calls
    ("nvfp4", 1, 90, dict(mma_enabled=True), K.CUDA_MMA),
    ("nvfp4", 9, 90, dict(mma_enabled=True, act_pack="1"), K.CUDA_MMA),
    ("nvfp4", 32, 80, dict(mma_enabled=True, prefill="fused"), K.CUDA_MMA),
    ("fp8", 1, 90, dict(mma_enabled=True), K.CUDA_MMA),
    ("fp8", 32, 86, dict(mma_enabled=True, partial=True), K.CUDA_MMA),
    ("fp8", 32, 90, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True), K.CUDA_MMA),
    # prefill
    ("nvfp4", 33, 90, dict(mma_enabled=True), K.DEQUANTIZE_CUBLAS),
    ("nvfp4", 33, 90, dict(mma_enabled=True, prefill="chunked"), K.CUDA_MMA_ROW_CHUNKS),
    ("nvfp4", 33, 90, dict(mma_enabled=True, prefill="fused"), K.TRITON_FUSED_PREFILL),
    ("nvfp4", 500, 75, dict(prefill="fused"), K.TRITON_FUSED_PREFILL),
    ("nvfp4", 500, 75, dict(prefill="chunked"), K.DEQUANTIZE_CUBLAS),  # no CUDA kernel to chunk
    ("fp8", 100, 90, dict(mma_enabled=True), K.DEQUANTIZE_CUBLAS),
    ("fp8", 100, 90, dict(mma_enabled=True, prefill="chunked"), K.CUDA_MMA_ROW_CHUNKS),
    ("fp8", 100, 90, dict(mma_enabled=True, prefill="fused"), K.DEQUANTIZE_CUBLAS),  # fused: NVFP4's only
    ("fp8", 100, 75, dict(prefill="chunked"), K.DEQUANTIZE_CUBLAS),
    # W8A8 on a GPU: sm_89+, not with chunked prefill, not for a share
    ("fp8", 40, 90, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True), K.W8A8_SCALED_MM),
    ("fp8", 40, 89, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True), K.W8A8_SCALED_MM),
    ("fp8", 40, 90, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True, prefill="chunked"),
     K.CUDA_MMA_ROW_CHUNKS),
    ("fp8", 40, 90, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True, partial=True),
     K.DEQUANTIZE_CUBLAS),
    ("fp8", 40, 90, dict(mma_enabled=True, fp8_prefill="w8a8"), K.DEQUANTIZE_CUBLAS),
    ("nvfp4", 40, 90, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True), K.DEQUANTIZE_CUBLAS),
    ("fp8", 40, 86, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True),
     (K.DEQUANTIZE_CUBLAS, False, W8A8_OFF_HERE)),
    ("fp8", 40, 86, dict(mma_enabled=True, fp8_prefill="w8a8", has_input_scale=True, prefill="chunked"),
     (K.CUDA_MMA_ROW_CHUNKS, False, W8A8_OFF_HERE)),
    ("fp8", 40, 75, dict(fp8_prefill="w8a8", has_input_scale=True), (K.DEQUANTIZE_CUBLAS, False, W8A8_OFF_HERE)),
    # no CUDA kernel (sm_70/75, no NVRTC, ANYFP4_KERNELS=triton): the Triton kernels
    ("nvfp4", 1, 75, {}, K.TRITON_GEMV),
    ("nvfp4", 1, 90, dict(act_pack="1"), K.TRITON_GEMV),
    ("nvfp4", 6, 75, {}, (K.TRITON_DECODE, False, None)),
    ("nvfp4", 7, 75, {}, (K.TRITON_DECODE, True, None)),  # block-pack from M = 7 on sm_75
    ("nvfp4", 7, 70, {}, (K.TRITON_DECODE, False, None)),
    ("nvfp4", 8, 70, {}, (K.TRITON_DECODE, True, None)),  # from M = 8 on sm_70
    ("nvfp4", 32, 90, {}, (K.TRITON_DECODE, False, None)),  # never on sm_90 (auto)
    ("nvfp4", 32, 90, dict(act_pack="1"), (K.TRITON_DECODE, True, None)),
    ("nvfp4", 32, 75, dict(act_pack="0"), (K.TRITON_DECODE, False, None)),
    ("nvfp4", 32, 75, dict(prefill="chunked"), (K.TRITON_DECODE, True, None)),  # prefill switches: M > 32 only
    ("fp8", 1, 75, {}, K.TRITON_GEMV),
    ("fp8", 2, 75, {}, K.DEQUANTIZE_CUBLAS),  # FP8 has no Triton decode kernel
    ("fp8", 32, 90, dict(act_pack="1"), K.DEQUANTIZE_CUBLAS),
]


@pytest.mark.parametrize("fmt, m, sm, facts, want", CASES, ids=lambda v: str(v))
def test_choice(fmt, m, sm, facts, want):
    kernel, act_pack, warning = want if isinstance(want, tuple) else (want, False, None)
    assert choose_kernel(fmt, m, sm, **facts) == Choice(kernel, act_pack=act_pack, warning=warning)


def test_every_kernel_is_somebodys_choice():
    chosen = set()
    for fmt, m, sm, facts, want in CASES:
        chosen.add(choose_kernel(fmt, m, sm, **facts).kernel)
    assert chosen == set(Kernel)


def test_the_policy_reads_no_environment(monkeypatch):
    for name in ("ANYFP4_PREFILL", "ANYFP4_ACT_PACK", "ANYFP4_FP8_PREFILL", "ANYFP4_KERNELS"):
        monkeypatch.setenv(name, "not-a-choice")
    assert choose_kernel("nvfp4", 100, 90, mma_enabled=True).kernel is Kernel.DEQUANTIZE_CUBLAS
    assert choose_kernel("fp8", 40, None, has_input_scale=True).kernel is Kernel.CPU


def test_rows_decide_between_decode_and_prefill_at_the_decode_row_limit():
    from anyfp4.dispatch.limits import DECODE_ROWS

    for fmt in ("nvfp4", "fp8"):
        assert choose_kernel(fmt, DECODE_ROWS, 90, mma_enabled=True).kernel is Kernel.CUDA_MMA
        assert choose_kernel(fmt, DECODE_ROWS + 1, 90, mma_enabled=True).kernel is Kernel.DEQUANTIZE_CUBLAS


def test_act_pack_auto_table():
    assert [m for m in range(1, 33) if act_pack_auto(75, m)] == list(range(7, 33))
    assert [m for m in range(1, 33) if act_pack_auto(70, m)] == list(range(8, 33))
    assert not any(act_pack_auto(sm, m) for sm in (80, 86, 89, 90) for m in range(1, 33))


def test_an_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown weight format 'int4'"):
        choose_kernel("int4", 1, 90)


def test_rows_keep_their_bits_only_on_the_cpu_and_the_cuda_kernel():
    from anyfp4.dispatch.policy import decode_rows_invariant

    assert decode_rows_invariant(None, False) and decode_rows_invariant(90, True)
    assert not decode_rows_invariant(70, False)


def test_speculation_refuses_a_path_whose_verify_rows_change_bits(monkeypatch):
    """On a GPU without the CUDA decode kernel for the model's dtype (sm_70 with CUDA 13's NVRTC; bf16 on sm_75)
    quantized layers run the Triton kernels, whose rows depend on M: speculation refuses, naming what it needs;
    sm_70 with CUDA 12's NVRTC, sm_75 with fp16 and sm_80 with bf16 go ahead."""
    import torch

    from anyfp4.formats.nvfp4 import quantize_nvfp4
    from anyfp4.kernels import device
    from anyfp4.kernels.cuda import nvrtc
    from anyfp4.nn.linear import NVFP4Linear
    from anyfp4.runtime.speculative import check_exact_verify

    layer = NVFP4Linear(quantize_nvfp4(torch.randn(32, 64)), None, "cpu")

    class OnAGpu(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.layer, self.device, self.dtype = layer, torch.device("cuda", 0), dtype

    monkeypatch.setattr(nvrtc, "available", lambda: True)
    for sm, dtype, refused, release in ((70, torch.float16, True, 13), (70, torch.float16, False, 12),
                                        (75, torch.bfloat16, True, 13), (75, torch.float16, False, 13),
                                        (80, torch.bfloat16, False, 13)):
        monkeypatch.setattr(nvrtc, "version", lambda release=release: (release, 0))
        monkeypatch.setattr(device, "device_arch", lambda index=None, sm=sm: (sm, 40))
        if refused:
            with pytest.raises(NotImplementedError, match=f"sm_{sm} .* needs the CUDA decode kernels"):
                check_exact_verify(OnAGpu(dtype))
        else:
            check_exact_verify(OnAGpu(dtype))


@pytest.mark.parametrize("fmt, m, sm, mma, shape, expected", [
    ("nvfp4", 33, 90, True, (5120, 1536), K.TRITON_FUSED_PREFILL),  # up to 64 rows: the fused GEMM, any shape
    ("nvfp4", 64, 90, True, (28672, 8192), K.TRITON_FUSED_PREFILL),
    ("nvfp4", 65, 90, True, (28672, 4096), K.TRITON_FUSED_PREFILL),  # gate + up, 65-128 rows: >= 24M elements
    ("nvfp4", 128, 90, True, (6144, 4096), K.TRITON_FUSED_PREFILL),
    ("nvfp4", 96, 90, True, (4096, 14336), K.TRITON_FUSED_PREFILL),
    ("nvfp4", 128, 90, True, (4096, 4096), K.DEQUANTIZE_CUBLAS),  # fewer elements: cuBLAS
    ("nvfp4", 96, 90, True, (5120, 1536), K.DEQUANTIZE_CUBLAS),
    ("nvfp4", 129, 90, True, (62080, 5120), K.DEQUANTIZE_CUBLAS),  # from 129 rows: cuBLAS
    ("fp8", 48, 90, True, (28672, 4096), K.DEQUANTIZE_CUBLAS),  # no fused FP8 GEMM
    ("nvfp4", 48, 89, True, (28672, 4096), K.DEQUANTIZE_CUBLAS),  # measured on sm_90 only
    ("nvfp4", 48, 90, False, (28672, 4096), K.DEQUANTIZE_CUBLAS),  # float32 activations / Triton kernels asked
    ("nvfp4", 32, 90, True, (28672, 4096), K.CUDA_MMA),  # decode-sized: not a prefill
])
def test_auto_prefill_picks_by_rows_and_shape(fmt, m, sm, mma, shape, expected):
    assert choose_kernel(fmt, m, sm, mma_enabled=mma, prefill="auto", weight_shape=shape).kernel is expected
    if m > 32:  # a named mode is obeyed whatever the shape; auto without a shape is dequantize + cuBLAS
        assert choose_kernel(fmt, m, sm, mma_enabled=mma, prefill="cublas", weight_shape=shape).kernel \
            is K.DEQUANTIZE_CUBLAS
        assert choose_kernel(fmt, m, sm, mma_enabled=mma, prefill="auto").kernel is K.DEQUANTIZE_CUBLAS


@pytest.mark.parametrize("m, shape, tile", [
    (48, (28672, 4096), (64, 64, 4, 1)), (64, (28672, 8192), (64, 128, 4, 1)), (64, (4096, 14336), (64, 64, 4, 4)),
    (48, (14336, 4096), (64, 64, 4, 1)), (64, (4096, 4096), (64, 64, 4, 4)), (64, (2048, 1152), (64, 64, 4, 1)),
    (128, (14336, 4096), (128, 128, 8, 1)), (128, (4096, 14336), (64, 64, 4, 1)), (128, (6144, 4096), (64, 64, 4, 1)),
    (1024, (4096, 4096), (128, 128, 8, 1)),
])
def test_fused_prefill_tiles_follow_the_sweep(m, shape, tile):
    """``dispatch.tuning.fused_config``: the tiles the H100 sweep chose (block_m, block_n, warps, K slices), each one
    the kernel takes (block_n divides a storage tile's 128 k-words' rows, block_k 128, the slices divide K's tiles:
    K = 1040 prepacks to 1152, nine tiles, no even split)."""
    from anyfp4.dispatch.tuning import fused_config

    c = fused_config(m, *shape)
    assert (c.block_m, c.block_n, c.num_warps, c.split_k) == tile
    assert 128 % c.block_n == 0 and c.block_k == 128 and (shape[1] // 128) % c.split_k == 0
    assert not c.swap_ab  # below sm_90: the decoded tile the second operand
    for sm in (80, 89, 90):  # on sm_90 the 128 x 128 tiles multiply w @ x^T; the tile itself stays
        h = fused_config(m, *shape, sm)
        assert h.swap_ab == (sm >= 90 and tile[:2] == (128, 128))
        assert (h.block_m, h.block_n, h.num_warps, h.split_k) == tile
