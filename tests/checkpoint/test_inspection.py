import json

import pytest

from anyfp4.checkpoint.inspection import inspect_checkpoint
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.cli import main
from helpers import TINY_LLAMA, rewrite_tensors, write_float_checkpoint

H, I, V, L = 64, 96, 128, 2
Q, KV = 64, 32  # 4 heads x 16, 2 kv heads x 16


def linear_params():
    per_layer = Q * H + 2 * KV * H + H * Q + 3 * I * H
    return per_layer * L


@pytest.mark.parametrize("fmt, per_weight", [("nvfp4", 0.5625), ("fp8", 1.0)])
def test_report_totals(tmp_path, fmt, per_weight):
    src = write_float_checkpoint(tmp_path / "src")
    dst = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    r = inspect_checkpoint(dst)
    assert r["valid"] and r["error"] is None and r["quant_algo"] == fmt.upper()
    assert r["quantized_layers"] == 14 and r["layers"] == 16
    lm_head = V * H * 2  # bf16, unquantized, read whole every token
    embedding_row = H * 2
    assert r["bytes_per_token"] == int(linear_params() * per_weight) + lm_head + embedding_row
    assert r["bf16_bytes_per_token"] == (linear_params() + V * H) * 2
    groups = {(g["group"], g["format"]): g for g in r["groups"]}
    up = groups[("mlp.up_proj", fmt)]
    assert up["count"] == L and up["shapes"] == [[I, H]]


def test_tied_embeddings_count_the_head(tmp_path):
    src = write_float_checkpoint(tmp_path / "src", dict(TINY_LLAMA, tie_word_embeddings=True))
    dst = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(progress=False)).dst
    r = inspect_checkpoint(dst)
    assert r["tied_embeddings"]
    assert r["bytes_per_token"] == int(linear_params() * 0.5625) + V * H * 2 + H * 2


def test_cli_json_and_invalid_verdict(tmp_path, capsys):
    src = write_float_checkpoint(tmp_path / "src")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--format", "mixed", "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "q"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and report["quant_algo"] == "MIXED_PRECISION"
    import torch
    rewrite_tensors(tmp_path / "q", lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight_scale_2",
                                                              torch.tensor(float("nan"))))
    assert main(["inspect", str(tmp_path / "q")]) == 1
    out = capsys.readouterr().out
    assert "invalid" in out and "weight_scale_2" in out
    # headers-only skips the value check
    assert main(["inspect", str(tmp_path / "q"), "--headers-only", "--json"]) == 0
    capsys.readouterr()


def test_cli_errors_are_one_line(tmp_path, capsys):
    src = write_float_checkpoint(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "x").write_text("x")
    assert main(["quantize", str(src), str(tmp_path / "dst"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("anyfp4 quantize: error: destination is not empty") and err.count("\n") == 1


def test_unquantized_layers_show_their_dtype_and_shards_honour_the_umask(tmp_path):
    """inspect labels a float layer by its stored dtype (not "none"); quantize's shards get the mode new files
    get (safetensors writes through a private 0600 temporary file)."""
    import os

    src = write_float_checkpoint(tmp_path / "src")
    old = os.umask(0o022)
    try:
        dst = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(progress=False)).dst
    finally:
        os.umask(old)
    assert all((f.stat().st_mode & 0o777) == 0o644 for f in dst.glob("*.safetensors"))
    formats = {g["group"]: g["format"] for g in inspect_checkpoint(dst)["groups"]}
    assert formats["lm_head"] == "bf16" and formats["mlp.up_proj"] == "nvfp4"
    assert "none" not in formats.values()
