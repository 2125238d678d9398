"""The row limit every layer agrees on, and the size below which a float layer's decode calls skip cuBLAS."""

# The most rows (tokens in a call) that the decode kernels take: decode steps, speculative verify passes of up to 31
# drafts, small batches. A call with more rows is a prefill. The CUDA and Triton decode kernels, the small-attention
# kernel, the graphed step, the cuBLAS row padding and the peer all-reduce are all built for this bound.
DECODE_ROWS = 32

# The rows of one launch of the CUDA decode kernel in a prefill's row chunks (ANYFP4_PREFILL=chunked): eight n8 tiles,
# the weight read once per 64 rows (sm_90 NVRTC: 110-131 registers a thread, gated 186-234, no spills; sixteen tiles
# spill when gated). A chunk's rows keep the bits the same rows get alone.
MMA_CHUNK_ROWS = 64

# A float (bf16 / fp16) layer with at most this many outputs runs its decode-sized calls through the one-launch
# GEMV of kernels/triton/dense_gemv.py instead of cuBLAS (padded rows, split-K GEMM and its reduction).
SMALL_DENSE_OUTPUTS = 256
