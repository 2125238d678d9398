"""dispatch/split_k.py: the K slices (split-K blocks x K warps) tensor-parallel shards take to compute one GPU's bits, asked of dispatch by
parallel/ (on an emulated sm_90 with 132 multiprocessors: the launch tables' splits)."""

import pytest
import torch

from anyfp4.dispatch import split_k
from anyfp4.kernels import device
from anyfp4.kernels.cuda import weight_mma

GPU = torch.device("cuda", 0)


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.delenv("ANYFP4_MMA_TABLE", raising=False)
    monkeypatch.setattr(device, "device_arch", lambda index=None: (90, 132))
    monkeypatch.setattr(weight_mma, "enabled", lambda sm: True)


def test_one_gpus_split_is_the_tables_at_m_1(h200):
    assert split_k.single_gpu_split_k(GPU, "nvfp4", False, 4096, 4096) == 8  # 4 blocks x 2 K warps
    assert split_k.single_gpu_split_k(GPU, "nvfp4", False, 14336, 4096) == 4  # gate_up halves' full layer: 2 blocks x 2 K warps
    assert split_k.single_gpu_split_k(GPU, "nvfp4", True, 14336, 4096) == 2
    assert split_k.single_gpu_split_k(GPU, "fp8", True, 14336, 4096) == 8
    assert split_k.single_gpu_split_k(GPU, "nvfp4", False, 1536, 576) == 1  # the heuristic's
    assert split_k.single_gpu_split_k(GPU, "nvfp4", False, 200, 1040) == 2  # K padded to 1280: 10 steps


def test_a_row_shard_takes_the_full_layers_split_over_tp(h200):
    assert split_k.row_parallel_split_k(GPU, "nvfp4", 4096, 4096, 2) == 4
    assert split_k.row_parallel_split_k(GPU, "nvfp4", 4096, 14336, 2) == 8
    assert split_k.row_parallel_split_k(GPU, "fp8", 4096, 14336, 2) == 8
    assert split_k.row_parallel_split_k(GPU, "nvfp4", 4096, 4096, 3) == 0  # 8 slices do not split in 3
    assert split_k.row_parallel_split_k(GPU, "nvfp4", 4096, 4096, 16) == 0  # 16 does not divide 8


def test_no_split_without_the_cuda_kernel(h200, monkeypatch):
    monkeypatch.setattr(weight_mma, "enabled", lambda sm: False)
    assert split_k.single_gpu_split_k(GPU, "nvfp4", False, 4096, 4096) == 0
    assert split_k.row_parallel_split_k(GPU, "nvfp4", 4096, 4096, 2) == 0
