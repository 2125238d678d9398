"""Export a float Hugging Face checkpoint with NVIDIA ModelOpt (run as a script, in its own process).

    python modelopt_export.py SRC DST nvfp4|fp8|mixed

Weights-only calibration (no forward loop): weight scales come from the weights alone,
which is what anyfp4's writer reproduces. ``mixed`` quantizes attention projections (and those of a hybrid's Gated
DeltaNet that the defaults quantize) FP8 and MLP projections NVFP4.
"""

import copy
import sys

import torch


def main(src: str, dst: str, fmt: str) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    if fmt == "mixed":
        cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
        fp8 = copy.deepcopy(mtq.FP8_DEFAULT_CFG)["quant_cfg"]
        quant_cfg = cfg["quant_cfg"]
        # attention and the Gated DeltaNet projections the defaults quantize (not in_proj_a / in_proj_b / conv1d) FP8
        for mixer in ("self_attn", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"):
            if isinstance(quant_cfg, dict):
                quant_cfg[f"*{mixer}*weight_quantizer"] = fp8["*weight_quantizer"]
                quant_cfg[f"*{mixer}*input_quantizer"] = fp8["*input_quantizer"]
            else:  # list-of-entries form
                quant_cfg.append({"quantizer_name": f"*{mixer}*weight_quantizer", **_entry(fp8, "*weight_quantizer")})
                quant_cfg.append({"quantizer_name": f"*{mixer}*input_quantizer", **_entry(fp8, "*input_quantizer")})
    else:
        cfg = {"nvfp4": mtq.NVFP4_DEFAULT_CFG, "fp8": mtq.FP8_DEFAULT_CFG}[fmt]
    model = mtq.quantize(model, cfg, forward_loop=None)
    export_hf_checkpoint(model, export_dir=dst)


def _entry(cfg, name):
    for e in cfg:
        if e.get("quantizer_name") == name:
            return {k: v for k, v in e.items() if k != "quantizer_name"}
    raise KeyError(name)


if __name__ == "__main__":
    main(*sys.argv[1:4])
