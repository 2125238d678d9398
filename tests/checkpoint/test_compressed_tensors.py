import pytest
import torch

from anyfp4.checkpoint.quant_config import WeightFormat
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.writer import QuantizeOptions, quantize_checkpoint
from helpers import to_compressed_tensors, write_float_checkpoint


def test_modelopt_and_compressed_tensors_twin_read_the_same(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    mo = quantize_checkpoint(src, tmp_path / "modelopt", QuantizeOptions(progress=False)).dst
    ct = to_compressed_tensors(mo, tmp_path / "ct")
    a, b = CheckpointReader(mo), CheckpointReader(ct)
    assert b.scheme.producer == "compressed-tensors"
    assert [(l.name, l.format) for l in a.layers] == [(l.name, l.format) for l in b.layers]
    n_quantized = 0
    for la, lb in zip(a.layers, b.layers):
        if la.format is not WeightFormat.NVFP4:
            assert torch.equal(a.dequantize(la), b.dequantize(lb))
            continue
        n_quantized += 1
        assert lb.global_scale_is_reciprocal and lb.tensors["codes"].endswith(".weight_packed")
        qa, qb = a.load_nvfp4(la), b.load_nvfp4(lb)
        assert torch.equal(qa.packed, qb.packed)
        assert torch.equal(qa.block_scale.view(torch.uint8), qb.block_scale.view(torch.uint8))
        # The twin stores 1 / scale in float32. Reciprocation is not an involution in float32
        # (about 1 value in 6 has no float32 preimage), so the scales agree to one ulp ...
        gap = (qa.global_scale.view(torch.int32) - qb.global_scale.view(torch.int32)).abs().item()
        assert gap <= 1
        # ... and the dequantized weights to one float32 ulp, and exactly at the bf16 the runtime uses.
        da, db = a.dequantize(la), b.dequantize(lb)
        assert torch.allclose(da, db, rtol=2**-23, atol=0)
        assert torch.equal(a.dequantize(la, torch.bfloat16), b.dequantize(lb, torch.bfloat16))
        if gap == 0:
            assert torch.equal(da, db)
    assert n_quantized == 14


def test_reciprocal_is_applied(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    mo = quantize_checkpoint(src, tmp_path / "modelopt", QuantizeOptions(progress=False)).dst
    ct = to_compressed_tensors(mo, tmp_path / "ct")
    layer = CheckpointReader(ct).layer_by_name["model.layers.0.mlp.up_proj"]
    stored = CheckpointReader(ct).load(layer.tensors["global_scale"]).item()
    assert stored > 1  # 2688 / amax
    assert CheckpointReader(ct).load_nvfp4(layer).global_scale.item() == pytest.approx(1 / stored, rel=1e-7)
