"""``anyfp4 bench --tp 2`` on CPU ranks (gloo): the report of rank 0 with what splitting costs."""

import json

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.loader import load_model
from helpers import TINY_LLAMA, free_port, write_float_checkpoint

CONFIG = dict(TINY_LLAMA, intermediate_size=128)  # 64 per rank: whole 16-element groups


@pytest.mark.slow
def test_bench_tp2_reports_the_cost_of_splitting(tmp_path, capsys):
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
