"""anyfp4: NVFP4 and FP8 weight-quantized LLM checkpoints on any NVIDIA GPU from sm_70.

Importing the package does no work: submodules are imported where they are used.
"""

__version__ = "0.1.0"
