"""Weights that cannot be quantized and writes that fail: one line naming the tensor or path, exit 2, and
nothing left behind; all-zero linears are quantized (to exact zeros)."""

import errno
import os
import resource
import signal
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open

from anyfp4 import cli
from anyfp4.checkpoint import writer as writer_module
from anyfp4.checkpoint.quant_config import WeightFormat
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from helpers import ForkedCli, rewrite_tensors, snapshot, write_float_checkpoint

ERROR = "anyfp4 quantize: error: "


@pytest.fixture
def src(tmp_path):
    return write_float_checkpoint(tmp_path / "src")


def quantize(*args) -> int:
    return cli.main(["quantize", *map(str, args), "--quiet"])


@pytest.mark.parametrize("fmt, module, values", [
    ("nvfp4", "model.layers.0.self_attn.k_proj", [float("nan")] * 3),  # k's NaN would poison q/k/v's shared scale
    ("fp8", "model.layers.1.self_attn.o_proj", [float("inf")]),
    ("mixed", "model.layers.1.mlp.down_proj", [float("-inf"), float("nan")]),
])
def test_non_finite_linear_is_refused_with_the_tensor_named(src, tmp_path, capsys, fmt, module, values):
    def poison(tensors):
        flat = tensors[f"{module}.weight"].view(-1)
        flat[:len(values)] = torch.tensor(values)

    rewrite_tensors(src, poison)
    assert quantize(src, tmp_path / "dst", "--format", fmt) == 2
    err = capsys.readouterr().err
    assert err == (f"{ERROR}{len(values)} weight value(s) are NaN or Inf, which cannot be quantized; fix the source "
                   f"or leave the layer unquantized with --exclude {module} (file {src / 'model.safetensors'}, "
                   f"tensor '{module}.weight')\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


ZEROED = ("model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj", "model.layers.1.mlp.gate_proj",
          "model.layers.1.mlp.up_proj")


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_all_zero_linears_quantize_to_exact_zeros(src, tmp_path, fmt):
    rewrite_tensors(src, lambda t: [t[f"{m}.weight"].zero_() for m in ZEROED])
    dst = quantize_checkpoint(src, tmp_path / "dst", QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    reader = CheckpointReader(dst)
    reader.validate_values()  # finite, positive scales
    layers = {layer.name: layer for layer in reader.layers}
    for module in ZEROED:
        assert torch.equal(reader.dequantize(layers[module]), torch.zeros(layers[module].out_features,
                                                                          layers[module].in_features))
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        if layers["model.layers.0.self_attn.k_proj"].format is WeightFormat.NVFP4:
            # a zero k_proj still shares q/k/v's global scale (as in ModelOpt's export), with block scales 1.0
            scale = f.get_tensor("model.layers.0.self_attn.q_proj.weight_scale_2")
            assert torch.equal(f.get_tensor("model.layers.0.self_attn.k_proj.weight_scale_2"), scale)
            assert (f.get_tensor("model.layers.0.self_attn.k_proj.weight_scale").float() == 1.0).all()
        if layers["model.layers.1.mlp.up_proj"].format is WeightFormat.NVFP4:  # a wholly zero group: 6 / (6 * 448)
            assert f.get_tensor("model.layers.1.mlp.up_proj.weight_scale_2").item() == torch.tensor(1 / 448).item()
        else:
            assert f.get_tensor("model.layers.1.mlp.up_proj.weight_scale").item() == 1.0


def _fail_mkdir_of_staging(monkeypatch):
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        if Path(path).name.startswith(".dst.partial-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)


def _fail_shard_write(monkeypatch):
    def save_file(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(writer_module, "save_file", save_file)


def _fail_config_write(monkeypatch):
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "config.json" and self.parent.name.startswith(".dst.partial-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def _fail_marking_the_old_checkpoint(monkeypatch):
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.parent.name == "dst":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


FAILURES = [(fail, reason, existing) for fail, reason in [
    (_fail_mkdir_of_staging, "Read-only file system"),
    (_fail_shard_write, "I/O error: No space left on device (os error 28)"),
    (_fail_config_write, "No space left on device"),
] for existing in (False, True)] + [(_fail_marking_the_old_checkpoint, "Read-only file system", True)]


@pytest.mark.parametrize("fail, reason, existing", FAILURES,
                         ids=[f"{f.__name__[6:]}-{'replacing' if e else 'new'}" for f, _, e in FAILURES])
def test_failed_write_is_one_line_and_changes_nothing(src, tmp_path, capsys, monkeypatch, fail, reason, existing):
    dst = tmp_path / "dst"
    if existing:
        assert quantize(src, dst, "--format", "fp8") == 0
    before = snapshot(tmp_path)
    fail(monkeypatch)
    assert quantize(src, dst, "--force") == 2
    assert capsys.readouterr().err == f"{ERROR}could not write the checkpoint: {reason} (file {dst})\n"
    assert snapshot(tmp_path) == before


def test_a_real_write_error_is_one_line(src, tmp_path):
    """A file-size limit makes the shard write fail in the kernel (EFBIG), as a full disk would."""
    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    dst = tmp_path / "dst"
    run = ForkedCli(["quantize", str(src), str(dst), "--quiet"], tmp_path / "stderr", prepare=limit_file_size)
    assert run.wait() == 2
    assert (tmp_path / "stderr").read_text() == (f"{ERROR}could not write the checkpoint: I/O error: File too large "
                                                 f"(os error 27) (file {dst})\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "stderr"]
