"""The one op boundary: ``torch.ops.anyfp4.*``. Every kernel is reached from here; importing this package
registers the ops (``ops.nvfp4``, ``ops.fp8``: the quantized linears, their references and CPU paths;
``ops.glue``: the runner's layer glue; ``ops.gdn``: the Gated DeltaNet mixer's; ``ops.linear_run``: the run both
formats share; ``ops.checks``: argument checks; ``ops.registry``: how the quantized linears are registered).

- ``nvfp4_linear(x, codes, scales, global_scale, bias, out_features, in_features)``:
  ``x @ W^T (+ bias)`` for an NVFP4 prepack (``packing.nvfp4``).
- ``nvfp4_gated(x, codes, scales, global_scale, up_offset, out_features, in_features)``:
  ``silu(x @ Wg^T) * (x @ Wu^T)`` for a gated prepack.
- ``fp8_linear(x, codes, scales, bias, out_features, in_features)`` and
  ``fp8_gated(x, codes, scales, up_offset, out_features, in_features)``: the same for an FP8
  prepack (``packing.fp8``): M = 1 runs an FP8 GEMV kernel, larger M dequantizes + cuBLAS.
  An optional last ``input_scale`` (the checkpoint's static activation scale) lets ``ANYFP4_FP8_PREFILL=w8a8``
  run more than 32 rows (``DECODE_ROWS``) as one FP8 ``torch._scaled_mm`` (``kernels.fp8_w8a8``).
- ``nvfp4_linear_partial(x, codes, scales, global_scale, out_features, in_features)`` and
  ``fp8_linear_partial(x, codes, scales, out_features, in_features)``: ``x @ W^T`` before the global / row
  scale, in float32, not rounded — a row-parallel rank's share of a sum that tensor parallelism adds up,
  then scales and rounds once.
- every quantized op takes an optional last argument ``split_k`` (0: the launch table's): the K slices of
  the CUDA decode kernel, which set the order a row's products are added in (tensor-parallel shards pass
  their full layer's, so that they compute one GPU's bits).
- ``nvfp4_experts(x, ids, codes, scales, global_scales, up_offset, out_features, in_features)``: a mixture of
  experts' NVFP4 linears for a step's (token, expert) pairs, the experts' prepacks stacked (E, ...), expert
  ``ids[p]`` for pair p of row ``p // (pairs / rows)``: one launch on CUDA (the CUDA decode kernel's grouped launch
  where it serves the GPU, else ``kernels.triton.nvfp4_experts``),
  the reference pair by pair elsewhere; ``dense_experts(x, ids, weights, gated, out_features, in_features)`` the
  same over float weights stacked (E, rows, K) (``kernels.triton.dense_experts``); ``weighted_slots(picked,
  weights)``: each token's k expert outputs times their routing weights, added in float32 in slot order (one
  launch on CUDA, ``kernels.triton.weighted_slots``); ``route_topk(logits, k, normalize)``: each token's k most
  probable experts (int32 ids, highest first) and their softmax probabilities, renormalized over the k when asked
  (one launch on CUDA, ``kernels.triton.route_topk``; ``ops.routing``).
- ``small_attention(q, k_cache, v_cache, mask, input_pos, key_start=None, gate=None)``: grouped-query attention of
  t <= 32 new positions over the static KV cache (``kernels.glue.small_attention``), (b, t, h, hd) out; CUDA only.
  ``gate`` (b, t, h, hd): the output times sigmoid(gate) in the same launch (Qwen3.5's attention output gate).
  ``key_start`` (b,): each sequence's first valid slot (a left-padded batch: its rows then get the bits they get
  alone).
- ``rope_cache(q, k, v, cos, sin, k_cache, v_cache, input_pos)``: rotary embedding of q and k (of their first
  ``cos.shape[-1]`` dims: partial rotary when the tables are narrower than a head), k and v
  written into the caches at ``input_pos`` (``kernels.glue.rope_cache`` on CUDA, its pure-torch definition on
  the CPU), rotated q out.
- ``rms_norm(x, weight, eps)``: RMSNorm over the last dimension (``kernels.glue.rms_norm``: one Triton
  program per row on CUDA, rows independent of each other; the pure-torch definition on the CPU);
  ``add_rms_norm(x, delta, weight, eps)``: ``(x + delta, rms_norm(x + delta))`` in one launch.
- ``causal_conv(x, weight, conv_state, snapshots)``: silu of a Gated DeltaNet layer's depthwise causal convolution
  over its rolling state; ``gated_delta_step(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads,
  valid, snapshots)``: the gates, the delta rule advancing the float32 recurrent state in place, and the gated
  RMSNorm (Triton kernels of ``kernels.gdn.step`` on CUDA for steps, ``kernels.gdn.reference`` otherwise; both
  can keep the state after every token); the pieces ``gated_delta(q, k, v, g, beta, state, chunk)`` and
  ``gated_rms_norm(x, gate, weight, eps)`` (pure torch on every device).

Inside the op (so torch.compile and CUDA graphs never bake a branch in) ``dispatch.policy.choose_kernel``
picks the kernel from M = rows of ``x``, the device and the ``ANYFP4_*`` switches read then: on CUDA,
M <= 32 on sm_80+: the CUDA tensor-core decode kernel (``kernels.cuda.weight_mma``, NVRTC, launch table or
heuristic; ``ANYFP4_KERNELS=triton`` turns it off); otherwise M = 1: the Triton GEMV kernel, M <= 32: the Triton
tensor-core decode kernel (activation block-pack by ``ANYFP4_ACT_PACK``); larger M: dequantize + cuBLAS
(prefill), with ``ANYFP4_PREFILL=fused`` one Triton GEMM that decodes weight tiles in registers (NVFP4), or
with ``ANYFP4_PREFILL=chunked`` the CUDA decode kernel 64 rows at a time. FP8 follows the same split (Triton:
GEMV at M = 1, dequantize + cuBLAS above). On the CPU: the C kernels (``kernels.cpu``) where they build, else the
pure-torch reference. Launch configs come from ``dispatch.tuning``.
"""

from . import experts, fp8, gdn, glue, nvfp4, routing  # registers torch.ops.anyfp4.*

__all__ = ["experts", "fp8", "gdn", "glue", "nvfp4", "routing"]
