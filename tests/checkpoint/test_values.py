"""Values: every tensor the model reads is checked as it is loaded (NaN/Inf, fp16 range, scale ranges),
and inspect's value pass is the same loads; nothing is read twice."""

import pytest
import torch

from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.tensor_index import TensorIndex
from anyfp4.checkpoint.values import FP8_SCALE_RANGE, NVFP4_RECIPROCAL_SCALE_RANGE, NVFP4_SCALE_RANGE
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.cli import main
from anyfp4.runtime.loader import load_model
from helpers import TINY_LLAMA, expect_refused, rewrite_tensors, to_compressed_tensors, write_float_checkpoint

UP = "model.layers.0.mlp.up_proj"
NAN, INF = float("nan"), float("inf")


def poke(name, index, value):
    def edit(t):
        x = t[name].clone()
        x.view(-1)[index] = value
        t[name] = x
    return edit


@pytest.mark.parametrize("name, value, fragment", [
    ("model.norm.weight", NAN, "tensor holds 1 NaN/Inf value(s), e.g. nan"),
    ("model.layers.1.input_layernorm.weight", INF, "tensor holds 1 NaN/Inf value(s), e.g. inf"),
    ("model.embed_tokens.weight", NAN, "tensor holds 1 NaN/Inf value(s), e.g. nan"),
    ("lm_head.weight", -INF, "weight holds 1 NaN/Inf value(s), e.g. -inf"),
    ("model.layers.0.self_attn.q_proj.bias", NAN, "bias holds 1 NaN/Inf value(s), e.g. nan"),
    ("model.layers.0.mlp.down_proj.weight", 1e30, "weight holds values beyond +-65504 (the fp16 range), e.g. 1e+30"),
])
def test_float_tensors_are_value_checked(tmp_path, capsys, name, value, fragment):
    path = write_float_checkpoint(tmp_path / "qwen2", dict(TINY_LLAMA, model_type="qwen2",
                                                           architectures=["Qwen2ForCausalLM"]), dtype=torch.float32)

    def biases(t):
        for i in range(2):
            for p in "qkv":
                rows = t[f"model.layers.{i}.self_attn.{p}_proj.weight"].shape[0]
                t[f"model.layers.{i}.self_attn.{p}_proj.bias"] = torch.zeros(rows)
    rewrite_tensors(path, biases)
    rewrite_tensors(path, poke(name, 5, value))
    message = expect_refused(path, fragment, capsys, names_file=path / "model.safetensors")
    assert repr(name) in message


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    src = write_float_checkpoint(root / "src")
    nvfp4 = quantize_checkpoint(src, root / "nvfp4", QuantizeOptions(progress=False)).dst
    fp8 = quantize_checkpoint(src, root / "fp8", QuantizeOptions(format=TargetFormat.FP8, progress=False)).dst
    return {"nvfp4": nvfp4, "fp8": fp8, "ct": to_compressed_tensors(nvfp4, root / "ct")}


def copy_of(quantized, kind, tmp_path):
    import shutil

    return shutil.copytree(quantized[kind], tmp_path / kind)


RANGE = "must lie in [{:.3g}, {:.3g}] (an amax of 5.96e-08 to 65504), found {}"


@pytest.mark.parametrize("kind, suffix, value, what, bounds, shown", [
    # 1e-40 is a float32 subnormal, shown as stored
    ("ct", "weight_global_scale", 1e-40, "NVFP4 global scale", NVFP4_RECIPROCAL_SCALE_RANGE, "9.99995e-41"),
    ("ct", "weight_global_scale", 0.01, "NVFP4 global scale", NVFP4_RECIPROCAL_SCALE_RANGE, "0.01"),
    ("ct", "weight_global_scale", 1e11, "NVFP4 global scale", NVFP4_RECIPROCAL_SCALE_RANGE, "1e+11"),
    ("nvfp4", "weight_scale_2", 1e30, "NVFP4 global scale", NVFP4_SCALE_RANGE, "1e+30"),
    ("nvfp4", "weight_scale_2", 1e-40, "NVFP4 global scale", NVFP4_SCALE_RANGE, "9.99995e-41"),
    ("fp8", "weight_scale", 1e30, "FP8 weight scale", FP8_SCALE_RANGE, "1e+30"),
    ("fp8", "weight_scale", 1e-20, "FP8 weight scale", FP8_SCALE_RANGE, "1e-20"),
])
def test_scales_outside_the_sane_range(quantized, tmp_path, capsys, kind, suffix, value, what, bounds, shown):
    path = copy_of(quantized, kind, tmp_path)
    rewrite_tensors(path, lambda t: t.__setitem__(f"{UP}.{suffix}", torch.tensor(value)))
    message = expect_refused(path, f"{what} " + RANGE.format(*bounds, shown), capsys,
                             names_file=path / "model.safetensors")
    assert repr(f"{UP}.{suffix}") in message


def test_the_ranges_are_derived_from_the_fp16_amax():
    lo, hi = 2.0**-24, 65504.0
    assert NVFP4_SCALE_RANGE == (lo / 2688, hi / 2688) and FP8_SCALE_RANGE == (lo / 448, hi / 448)
    assert NVFP4_RECIPROCAL_SCALE_RANGE == pytest.approx((2688 / hi, 2688 / lo))
    for g in NVFP4_RECIPROCAL_SCALE_RANGE:  # the reciprocal the loader takes is a finite normal float32
        r = (1.0 / torch.tensor(g, dtype=torch.float64)).float()
        assert torch.isfinite(r) and r.item() >= torch.finfo(torch.float32).tiny


@pytest.mark.parametrize("kind", ["nvfp4", "fp8", "ct"])
def test_edges_of_the_range_load(quantized, tmp_path, kind):
    path = copy_of(quantized, kind, tmp_path)
    suffix = {"nvfp4": "weight_scale_2", "fp8": "weight_scale", "ct": "weight_global_scale"}[kind]
    bounds = {"nvfp4": NVFP4_SCALE_RANGE, "fp8": FP8_SCALE_RANGE, "ct": NVFP4_RECIPROCAL_SCALE_RANGE}[kind]
    for edge in bounds:
        value = torch.tensor(edge, dtype=torch.float32)
        value = value if bounds[0] <= value.item() <= bounds[1] else torch.nextafter(value, torch.tensor(1.0))
        rewrite_tensors(path, lambda t: t.__setitem__(f"{UP}.{suffix}", value))
        CheckpointReader(path).validate_values()


def test_load_checks_values_in_one_read_and_inspect_uses_the_same_loads(quantized, tmp_path, monkeypatch, capsys):
    reads = []
    original = TensorIndex.load
    monkeypatch.setattr(TensorIndex, "load", lambda self, name: reads.append(name) or original(self, name))
    load_model(quantized["nvfp4"], "cpu", torch.float32, progress=False)
    assert len(reads) == len(set(reads)), "a tensor was read twice while loading"
    loaded = set(reads)
    reads.clear()
    assert main(["inspect", str(quantized["nvfp4"]), "--json"]) == 0
    assert set(reads) == loaded and len(reads) == len(loaded)
    capsys.readouterr()
