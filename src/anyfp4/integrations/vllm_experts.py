"""The vLLM plugin's method for expert layers (vLLM's ``RoutedExperts`` / ``FusedMoE``): a mixture's NVFP4 or FP8
experts run through anyfp4's own experts (``runtime.experts``: the grouped ops on a GPU, each picked expert over its
rows on the CPU), with vLLM's router picking them.

vLLM hands each checkpoint tensor of an expert (``experts.E.{gate,up,down}_proj.*``, or Mixtral's ``w1`` / ``w3`` /
``w2``) to the parameter it maps it to (``w13_*`` for gate and up, ``w2_*`` for down) with the expert's id and
its shard (``w1`` gate, ``w3`` up, ``w2`` down). The parameters here carry their own loader: each tensor-parallel
rank keeps its rows of gate / up and its columns of down (whole 16-element groups for NVFP4), every tensor is
checked against the slot it fills, and after loading a tensor that never came is named. Then each expert becomes an
``nn.linear.GatedMLP`` (gate and up fused where their scales allow) and the checkpoint's stacks are dropped.

Not supported, each refused by name: expert parallelism, shared experts handed to the method, activations other than
SiLU-gated, expert biases, router weights applied to the input.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase

from ..checkpoint.modules import quantized_suffixes
from ..checkpoint.quant_config import WeightFormat
from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import NVFP4Weight
from ..nn.linear import GatedMLP
from ..runtime.experts import stacked_experts, weighted_experts

# apply() calls per format in this process (tests read it to prove the plugin's path really ran)
APPLY_CALLS = {"nvfp4": 0, "fp8": 0}
SHARD_PART = {"w1": "gate", "w3": "up", "w2": "down"}


class ExpertParam:
    """How one parameter of the stacks is filled: ``stack`` w13 (gate rows, then up rows) or w2 (down); ``kind``
    "matrix" (E, rows, columns: codes and block scales, sharded like their weight), "row" (E, rows: a per-channel
    scale, gate / up sharded) or "tensor" (E, 2) / (E,): one value per expert and part; ``pack`` input features per
    stored column."""

    def __init__(self, stack: str, kind: str, pack: int = 1, required: bool = True, reciprocal: bool = False):
        self.stack, self.kind, self.pack, self.required, self.reciprocal = stack, kind, pack, required, reciprocal


class AnyFP4ExpertsMethod(FusedMoEMethodBase):
    """One vLLM expert layer in NVFP4 or FP8 through anyfp4's experts."""

    def __init__(self, config, fmt: WeightFormat, prefix: str, moe):
        super().__init__(moe)
        self.config, self.fmt, self.prefix = config, fmt, prefix

    def _refuse(self, what: str) -> ValueError:
        return ValueError(f"anyfp4: {self.prefix}: {what}; the anyfp4 vLLM plugin does not run it")

    def _names(self) -> dict[str, str]:
        """The checkpoint's tensor suffixes: codes, block scales / FP8 scales, NVFP4 global scales, input scales."""
        return quantized_suffixes(self.config.scheme.naming, self.fmt)

    def _params(self) -> dict[str, ExpertParam]:
        names, nvfp4 = self._names(), self.fmt is WeightFormat.NVFP4
        params = {}
        for stack in ("w13", "w2"):
            params[f"{stack}_{names['codes']}"] = ExpertParam(stack, "matrix", 2 if nvfp4 else 1)
            if nvfp4:
                params[f"{stack}_{names['scale']}"] = ExpertParam(stack, "matrix", 16)
                params[f"{stack}_{names['global']}"] = ExpertParam(stack, "tensor",
                                                                   reciprocal=names["global"] == "weight_global_scale")
            else:
                params[f"{stack}_{names['scale']}"] = ExpertParam(stack, "row" if self.config.fp8_per_channel
                                                                  else "tensor")
            for extra in {names["input"], "input_scale"}:  # activation scales: loaded, not used (weight-only)
                params[f"{stack}_{extra}"] = ExpertParam(stack, "tensor", required=False)
        return params

    def create_weights(self, layer, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        moe = self.moe
        if num_experts != extra_weight_attrs.get("global_num_experts", num_experts) or layer.use_ep:
            raise self._refuse("expert parallelism")
        if moe.has_bias:
            raise self._refuse("experts with biases")
        if getattr(moe.activation, "value", moe.activation) != "silu" or not moe.is_act_and_mul:
            raise self._refuse(f"the expert activation {getattr(moe.activation, 'value', moe.activation)}")
        inter, hidden = intermediate_size_per_partition, hidden_size
        if self.fmt is WeightFormat.NVFP4 and (inter % 16 or hidden % 16):
            raise ValueError(f"anyfp4: {self.prefix} has {inter} expert hidden units per tensor-parallel rank and "
                             f"hidden size {hidden}; NVFP4 needs whole 16-element groups (choose a tensor-parallel "
                             "size that splits them so)")
        fp8 = torch.float8_e4m3fn
        code_dtype = torch.uint8 if self.fmt is WeightFormat.NVFP4 else fp8
        layer.anyfp4_sizes = (num_experts, inter, hidden)
        layer.anyfp4_params = self._params()
        layer.anyfp4_loaded = {}
        for name, spec in layer.anyfp4_params.items():
            rows = 2 * inter if spec.stack == "w13" else hidden
            k = hidden if spec.stack == "w13" else inter
            if spec.kind == "matrix":
                dtype = code_dtype if spec.pack != 16 else fp8
                data = torch.empty(num_experts, rows, k // spec.pack, dtype=dtype)
            elif spec.kind == "row":
                data = torch.full((num_experts, rows), float("nan"))
            else:
                data = torch.full((num_experts, 2) if spec.stack == "w13" else (num_experts,), float("nan"))
            param = nn.Parameter(data, requires_grad=False)
            param.weight_loader = self._loader(layer, name)
            layer.register_parameter(name, param)
            layer.anyfp4_loaded[name] = set()

    def _loader(self, layer, name: str):
        spec = layer.anyfp4_params[name]
        experts, inter, _ = layer.anyfp4_sizes
        parallel = layer.moe_config.moe_parallel_config
        rank = parallel.tp_rank

        def load(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
            if shard_id not in SHARD_PART:
                raise ValueError(f"anyfp4: {self.prefix}.{name}: unknown expert shard {shard_id!r}")
            what = f"{self.prefix}.{expert_id}.{SHARD_PART[shard_id]} ({name})"
            if not 0 <= expert_id < experts:
                raise ValueError(f"anyfp4: {what}: the layer has {experts} experts")
            w = loaded_weight
            if spec.kind == "tensor":
                if w.numel() != 1:
                    raise ValueError(f"anyfp4: {what} must hold one value, got shape {tuple(w.shape)}")
                value = w.reshape(()).float()
                if spec.reciprocal:
                    value = 1.0 / value
                if spec.stack == "w13":
                    param.data[expert_id, 0 if shard_id == "w1" else 1] = value
                else:
                    param.data[expert_id] = value
            else:
                if spec.kind == "row":
                    w = w.reshape(-1, 1).float()
                if shard_id == "w2":
                    target = param.data[expert_id]
                    if spec.kind == "matrix":  # down: this rank's columns (the whole rows of a per-channel scale)
                        cols = target.shape[1]
                        w = w[:, rank * cols:(rank + 1) * cols]
                else:
                    half = param.data.shape[1] // 2
                    target = param.data[expert_id, :half] if shard_id == "w1" else param.data[expert_id, half:]
                    w = w[rank * inter:(rank + 1) * inter]
                if spec.kind == "row":
                    w = w.reshape(-1)
                if tuple(w.shape) != tuple(target.shape) or (spec.kind == "matrix" and w.dtype != target.dtype):
                    raise ValueError(f"anyfp4: {what} is {tuple(loaded_weight.shape)} {loaded_weight.dtype}; this "
                                     f"rank's slot takes {tuple(target.shape)} {target.dtype}")
                target.copy_(w)
            layer.anyfp4_loaded[name].add((expert_id, shard_id))
            return True if return_success else None

        return load

    def process_weights_after_loading(self, layer) -> None:
        experts, inter, _ = layer.anyfp4_sizes
        for name, spec in layer.anyfp4_params.items():
            shards = ("w1", "w3") if spec.stack == "w13" else ("w2",)
            missing = [(e, s) for e in range(experts) for s in shards if (e, s) not in layer.anyfp4_loaded[name]]
            if missing and spec.required:
                e, s = missing[0]
                raise ValueError(f"anyfp4: {self.prefix}.{e}.{SHARD_PART[s]} has no {name} in the checkpoint "
                                 f"({len(missing)} expert tensors missing)")
        p = {name: getattr(layer, name).data for name in layer.anyfp4_params}
        self._check_scales(p)
        built = [GatedMLP(*self._expert_weights(p, e, inter), device=p[next(iter(p))].device,
                          dtype=self.moe.in_dtype) for e in range(experts)]
        for name in layer.anyfp4_params:  # the experts' prepacks replace the checkpoint's stacks
            delattr(layer, name)
        layer.anyfp4_experts = nn.ModuleList(built)
        layer.anyfp4_stacked = stacked_experts(built)

    def _check_scales(self, p: dict[str, torch.Tensor]) -> None:
        """Every expert's per-tensor scales (NVFP4 global scales, FP8 scales) positive and finite: one check a layer."""
        n = self._names()
        key = "global" if self.fmt is WeightFormat.NVFP4 else "scale"
        for stack in ("w13", "w2"):
            t = p[f"{stack}_{n[key]}"]
            bad = ~(torch.isfinite(t) & (t > 0))
            if bool(bad.any()):
                e = int(bad.reshape(t.shape[0], -1).any(-1).nonzero()[0])
                part = "down" if stack == "w2" else "gate / up"
                raise ValueError(f"anyfp4: {self.prefix}.{e}: the {part} {stack}_{n[key]} must be positive and finite, "
                                 f"got {t[e].tolist()}")

    def _expert_weights(self, p: dict[str, torch.Tensor], e: int, inter: int):
        """Expert e's gate, up and down weights, views of the loaded stacks."""
        n = self._names()
        codes13, codes2 = p[f"w13_{n['codes']}"], p[f"w2_{n['codes']}"]
        s13, s2 = p[f"w13_{n['scale']}"], p[f"w2_{n['scale']}"]
        if self.fmt is WeightFormat.NVFP4:
            g = torch.cat([p[f"w13_{n['global']}"][e], p[f"w2_{n['global']}"][e].reshape(1)])
            return (NVFP4Weight(codes13[e, :inter], s13[e, :inter], g[0].clone()),
                    NVFP4Weight(codes13[e, inter:], s13[e, inter:], g[1].clone()),
                    NVFP4Weight(codes2[e], s2[e], g[2].clone()))
        if self.config.fp8_per_channel:
            gate_s, up_s, down_s = s13[e, :inter], s13[e, inter:], s2[e]
        else:
            gate_s, up_s, down_s = s13[e, 0], s13[e, 1], s2[e]
        return (FP8Weight(codes13[e, :inter], gate_s.clone()), FP8Weight(codes13[e, inter:], up_s.clone()),
                FP8Weight(codes2[e], down_s.clone()))

    def get_fused_moe_quant_config(self, layer):
        return None

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts=None,
              shared_experts_input=None) -> torch.Tensor:
        if shared_experts is not None:
            raise self._refuse("shared experts")
        if getattr(layer, "apply_router_weight_on_input", False):
            raise self._refuse("router weights applied to the input")
        APPLY_CALLS[self.fmt.value] += 1
        out = weighted_experts(layer.anyfp4_experts, layer.anyfp4_stacked, x, topk_ids, topk_weights)
        return out.to(x.dtype)
