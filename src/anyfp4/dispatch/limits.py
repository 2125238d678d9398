"""The row limit every layer agrees on."""

# The most rows (tokens in a call) that the decode kernels take: decode steps, speculative verify passes of up to 31
# drafts, small batches. A call with more rows is a prefill. The CUDA and Triton decode kernels, the small-attention
# kernel, the graphed step, the cuBLAS row padding and the peer all-reduce are all built for this bound.
DECODE_ROWS = 32
