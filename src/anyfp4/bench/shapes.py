"""The linear shapes and activation rows the kernel benchmarks time."""

# (N, K): Llama-3.1-8B's (4096 x 4096, 14336 x 4096, 4096 x 14336), Llama-3-70B's gate/up (28672 x 8192), and
# projections of a 5120-wide model
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (3584, 5120), (8704, 5120), (5120, 1536), (5120, 4352),
          (62080, 5120), (28672, 8192)]
DECODE_M = [1, 2, 4, 8, 16, 32]  # rows of a decode or verify step: the decode kernels
PREFILL_M = [64, 256, 1024, 4096]  # rows of a prompt: the prefill path
