"""Tensor parallelism on the CPU (gloo, 2 processes): sharded greedy output equals one process."""

import socket

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.config import ModelArgs
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.parallel.tensor_parallel import generate_tp, rank_args
from helpers import TINY_LLAMA, write_float_checkpoint

CONFIG = dict(TINY_LLAMA, intermediate_size=128)  # 64 per rank: whole 16-element groups


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_tp2_equals_single_process(tmp_path, fmt):
    src = write_float_checkpoint(tmp_path / "src", CONFIG)
    ckpt = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_vocab_parallel_lm_head_equals_single_process(tmp_path, monkeypatch, tied):
    """ANYFP4_TP_LM_HEAD=vocab: each rank computes its rows of the logits (127 rows: slices of 64 and 63), the
    all-gather puts them back in order; tied embeddings give each rank its rows of the embedding."""
    from anyfp4.parallel.tensor_parallel import vocab_slice

    assert [vocab_slice(127, r, 2) for r in range(2)] == [(0, 64), (64, 127)]
    assert [vocab_slice(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    src = write_float_checkpoint(tmp_path / "src", dict(CONFIG, vocab_size=127, tie_word_embeddings=tied))
    ckpt = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    monkeypatch.setenv("ANYFP4_TP_LM_HEAD", "vocab")
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single


def test_uneven_splits_are_refused():
    args = ModelArgs.from_hf(dict(CONFIG, num_key_value_heads=1, num_attention_heads=4))
    with pytest.raises(ValueError, match="cannot split this model over 2 ranks: 1 key/value heads"):
        rank_args(args, 2)
    with pytest.raises(ValueError, match="intermediate size 96"):
        rank_args(ModelArgs.from_hf(TINY_LLAMA), 4)


@pytest.mark.slow
def test_cli_tp_on_smollm2(smollm2_bf16, tmp_path, capsys, monkeypatch):
    from anyfp4.cli import main

    ckpt = quantize_checkpoint(smollm2_bf16, tmp_path / "fp8", QuantizeOptions(format=TargetFormat.FP8,
                                                                                progress=False)).dst
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert main(["generate", str(ckpt), "--prompt", "What is the capital of France?", "--chat", "--tp", "3",
                 "--max-tokens", "12", "--device", "cpu", "--quiet"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_uneven_split_is_refused_before_spawning(tmp_path):
    src = write_float_checkpoint(tmp_path / "src", dict(CONFIG, num_key_value_heads=1))
    with pytest.raises(ValueError, match="1 key/value heads"):
        generate_tp(src, [[1, 2]], SamplingParams(max_new_tokens=2), tp=2, port=free_port())


@pytest.mark.slow
def test_bench_tp2_reports_the_cost_of_splitting(tmp_path, capsys):
    import json

    from anyfp4.cli import main

    src = write_float_checkpoint(tmp_path / "src", CONFIG)
    ckpt = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    assert main(["bench", str(ckpt), "--tp", "2", "--device", "cpu", "--prompt-len", "8", "--gen-len", "6",
                 "--json", "--port", str(free_port())]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tp"] == 2 and len(r["ranks"]) == 2 and r["same_tokens_on_every_rank"]
    assert r["allreduce_us"] > 0 and 0 < r["allreduce_share"] and r["decode_tok_s"] > 0
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    from anyfp4.bench.model import bench_model

    assert bench_model(model, 8, 6, 1)["sha256"] == r["sha256"]  # same greedy tokens as one process


def _peer_sum_worker(rank: int, port: int, failures) -> None:
    import os

    import torch.distributed as dist

    from anyfp4.dispatch.limits import DECODE_ROWS as PEER_ROWS
    from anyfp4.parallel.tensor_parallel import all_reduce_sum, init_process_group, peer_all_reduce

    os.environ["MASTER_PORT"] = str(port)
    init_process_group(rank, 2, "cuda", port)
    dev = torch.device("cuda", rank)
    peer = peer_all_reduce(dev, 256)
    assert peer is not None
    gens = [torch.Generator(device=dev).manual_seed(100 + r) for r in range(2)]
    src = [torch.randn(40, 3, 256, device=dev, generator=g) for g in gens]  # both ranks' inputs, on every rank
    mine = src[rank].clone()
    outs = [None] * 40
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for i in range(40):  # back to back through one buffer: each sum must wait for the previous one's readers
            outs[i] = all_reduce_sum(mine[i], peer)
    graph.replay()
    torch.cuda.synchronize()
    want = src[0] + src[1]
    bad = [i for i in range(40) if not torch.equal(outs[i], want[i])]
    big = torch.randn(PEER_ROWS + 1, 256, device=dev, generator=gens[rank])  # too large: NCCL
    total = all_reduce_sum(big.clone(), peer)
    dist.all_reduce(big)
    if bad or not torch.equal(total, big):
        failures.put((rank, bad))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_peer_all_reduce_in_a_cuda_graph():
    """40 float32 sums captured back to back in one graph through the peer buffer: every one exact on both
    ranks (a + b in float32); a tensor larger than the buffer goes through NCCL."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    mp.spawn(_peer_sum_worker, args=(free_port(), failures), nprocs=2, join=True)
    assert failures.empty(), failures.get()
