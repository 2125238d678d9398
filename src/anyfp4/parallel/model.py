"""A rank's shard of a model (``build_model_tp``, ``load_model_tp``) and generation with the model split over
processes (``generate_tp``)."""

from __future__ import annotations

import torch

from ..env import tp_lm_head
from ..runtime.config import ModelArgs
from ..runtime.generate import generate
from ..runtime.loader import CheckpointSource, WeightSource, build_model
from ..runtime.plan import plan_checkpoint
from .ranks import check_rank_devices, run_on_ranks
from .sharding import ShardedSource, rank_args, shard_lm_head, wrap_row_parallel


def build_model_tp(args: ModelArgs, src: WeightSource, device, dtype, rank: int, tp: int, progress: bool = False):
    """Rank ``rank``'s shard of the model ``src`` holds whole: its slices of every linear, the all-reduces after
    the row-parallel ones, and the lm_head replicated or split by vocabulary (``ANYFP4_TP_LM_HEAD``)."""
    vocab_parallel = tp_lm_head() == "vocab"
    with torch.no_grad():
        model = build_model(rank_args(args, tp), ShardedSource(src, rank, tp, vocab_parallel, args.gdn),
                            torch.device(device), dtype, progress)
    wrap_row_parallel(model, tp)
    if vocab_parallel:
        shard_lm_head(model, rank, tp)
    return model


def load_model_tp(path, device, dtype, rank: int, tp: int, progress: bool = False):
    """This rank's shard of the checkpoint at ``path`` (the process group must be initialised)."""
    plan = plan_checkpoint(path)
    return build_model_tp(plan.args, CheckpointSource(plan), device, dtype, rank, tp, progress and rank == 0)


def generate_rank(rank: int, tp: int, device: torch.device, path: str, prompts: list, params, dtype_name: str):
    """One rank of ``generate_tp``: load the shard and generate (every rank takes the same greedy or
    same-seeded sampling decisions)."""
    model = load_model_tp(path, device, getattr(torch, dtype_name), rank, tp)
    return model, generate(model, prompts, params)


def generate_tp(path, prompts: list, params, tp: int, device_type: str = "cpu", dtype_name: str = "float32",
                port: int = 29517) -> list[list[int]]:
    """Greedy / sampled generation with the model split over ``tp`` processes (one per GPU, or CPU ranks)."""
    check_rank_devices(tp, device_type)
    rank_args(plan_checkpoint(path).args, tp)  # a consistent checkpoint, split evenly: checked before spawning
    return run_on_ranks(generate_rank, (str(path), prompts, params, dtype_name), tp, device_type, port)
