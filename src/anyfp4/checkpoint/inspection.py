"""``anyfp4 inspect``: what a checkpoint holds, what decoding a token reads, and whether it is valid.

"Valid" means ``generate`` runs it: the structure (headers), config.json against the tensors (the
runner's own check, ``runtime/plan.py``), the tokenizer and generation_config.json, and, unless
headers-only, every value the loader reads, through the loader's own checked loads.
Exit codes: 0 valid, 1 invalid, 2 unreadable.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from .errors import CheckpointError
from .modules import LayerSpec
from .quant_config import WeightFormat

BF16_BYTES = 2
EXIT_CODES = {"valid": 0, "invalid": 1, "unreadable": 2}


def _is_embedding(layer: LayerSpec) -> bool:
    leaf = layer.name.rsplit(".", 1)[-1]
    return "embed" in leaf or leaf in ("wte", "word_embeddings")


def _group_key(layer: LayerSpec) -> str:
    """``model.layers.7.mlp.up_proj`` -> ``mlp.up_proj``, ``model.layers.7.mlp.experts.5.up_proj`` ->
    ``mlp.experts.*.up_proj``: one row per projection kind."""
    parts = layer.name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join("*" if p.isdigit() else p for p in parts[i + 1:])
    return layer.name


def _stored_bytes(reader, layer: LayerSpec) -> int:
    return sum(reader.index[t].nbytes for t in layer.tensors.values())


def inspect_checkpoint(path: str | Path, check_values: bool = True, progress: bool = False) -> dict:
    """A JSON-ready report. Never raises for a bad checkpoint: ``status`` (valid / invalid / unreadable)
    and ``error`` say what is wrong."""
    from ..runtime.plan import plan_model
    from .reader import CheckpointReader

    report: dict = {"path": str(path), "status": "invalid", "valid": False, "error": None}
    if not Path(path).is_dir():
        report.update(status="unreadable", error=str(CheckpointError("not a checkpoint directory", file=path)))
        return report
    try:
        reader = CheckpointReader(path)
    except CheckpointError as e:
        report["error"] = str(e)
        return report
    report["producer"] = reader.scheme.producer
    report["quant_algo"] = reader.scheme.algo
    report["notes"] = list(reader.notes)
    report.update(_layer_summary(reader))
    try:
        plan = plan_model(reader)
    except CheckpointError as e:  # UnsupportedModelError included
        report["error"] = str(e)
        return report
    report["architecture"] = plan.architecture
    if plan.args.moe is not None:
        m = plan.args.moe
        report["experts"] = {"per_layer": m.experts, "per_token": m.top_k, "layers": len(m.sparse_layers)}
    types = plan.args.layer_types
    if types:  # a hybrid: which token mixer each decoder layer has, and whether an MTP head is stored
        report["layer_types"] = {t: types.count(t) for t in dict.fromkeys(types)}
        report["mtp_tensors"] = sum(n.startswith("mtp.") for n in reader.index.names())
    try:
        _check_generation_files(reader.root, plan.args.vocab_size)
    except CheckpointError as e:
        report["error"] = str(e)
        return report
    report["tied_embeddings"] = plan.tied_head
    report.update(_bytes_per_token(reader, plan))
    if check_values:
        try:
            reader.validate_values(plan.layers(), tuple(plan.tensors), progress=progress)
        except CheckpointError as e:
            report["error"] = str(e)
            return report
    report.update(status="valid", valid=True, values_checked=check_values)
    return report


def _check_generation_files(root: Path, vocab_size: int) -> None:
    """What ``generate`` reads besides the weights: the tokenizer and generation_config.json."""
    from ..runtime.session import checkpoint_stop_ids, load_tokenizer

    checkpoint_stop_ids(root, load_tokenizer(root, vocab_size))


def exit_code(report: dict) -> int:
    return EXIT_CODES[report["status"]]


def _format_label(reader, layer: LayerSpec) -> str:
    """The layer's quantization format, or for an unquantized layer its stored dtype (bf16, fp16, fp32)."""
    import torch

    if layer.format is not WeightFormat.NONE:
        return layer.format.value
    dtype = reader.index[layer.tensors["weight"]].dtype
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return names.get(dtype, str(dtype).replace("torch.", ""))


def _layer_summary(reader) -> dict:
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    stored = 0
    for layer in reader.layers:
        key = (_group_key(layer), _format_label(reader, layer))
        g = groups.setdefault(key, {"group": key[0], "format": key[1], "count": 0, "shapes": [], "bytes": 0,
                                    "role": "embedding" if _is_embedding(layer) else "linear"})
        g["count"] += 1
        shape = [layer.out_features, layer.in_features]
        if shape not in g["shapes"]:
            g["shapes"].append(shape)
        nbytes = _stored_bytes(reader, layer)
        g["bytes"] += nbytes
        stored += nbytes
    return dict(groups=list(groups.values()), layers=len(reader.layers),
                quantized_layers=sum(l.format is not WeightFormat.NONE for l in reader.layers),
                total_weight_bytes=stored)


def _bytes_per_token(reader, plan) -> dict:
    """The weight bytes a decode step reads: the layers the runner reads (not an MTP head's or a vision tower's)."""
    tied = plan.tied_head
    layers = [l for l in reader.layers if l.name in plan.linears or f"{l.name}.weight" in plan.tensors]
    moe = plan.args.moe
    per_token = bf16 = 0
    for layer in layers:
        nbytes = _stored_bytes(reader, layer)
        if _is_embedding(layer):
            per_token += nbytes // max(layer.out_features, 1)  # one row is gathered per token
        else:
            share = (moe.top_k, moe.experts) if moe and ".experts." in layer.name else (1, 1)  # k of E experts
            per_token += (layer.weight_bytes if layer.format is not WeightFormat.NONE else nbytes) * share[0] // share[1]
            bf16 += layer.out_features * layer.in_features * BF16_BYTES * share[0] // share[1]
    emb = next((l for l in layers if _is_embedding(l)), None)
    if tied and emb is not None:  # the output head reads the whole embedding matrix every token
        per_token += _stored_bytes(reader, emb)
        bf16 += emb.out_features * emb.in_features * BF16_BYTES
    return dict(bytes_per_token=per_token, bf16_bytes_per_token=bf16,
                compression_vs_bf16=(bf16 / per_token) if per_token else None)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if "groups" in report:
        table = Table(title=f"{report['path']}  ({report['producer']}, {report['quant_algo']})")
        for col in ("layer group", "format", "count", "shape (N x K)", "bytes"):
            table.add_column(col, justify="right" if col in ("count", "bytes") else "left")
        for g in report["groups"]:
            shapes = ", ".join(f"{n} x {k}" for n, k in g["shapes"])
            table.add_row(g["group"], g["format"], str(g["count"]), shapes, _human(g["bytes"]))
        console.print(table)
        console.print(f"layers: {report['layers']} ({report['quantized_layers']} quantized)   "
                      f"stored weights: {_human(report['total_weight_bytes'])}")
    if "experts" in report:
        e = report["experts"]
        console.print(f"mixture of experts: {e['per_layer']} experts in each of {e['layers']} layers, "
                      f"{e['per_token']} run per token (counted so below)")
    if "bytes_per_token" in report:
        console.print(
            f"weight bytes read per decoded token: {_human(report['bytes_per_token'])} "
            f"(bf16: {_human(report['bf16_bytes_per_token'])}, "
            f"compression {report['compression_vs_bf16']:.2f}x)"
            + ("   [tied embeddings: lm_head reads the embedding matrix]" if report["tied_embeddings"] else "")
        )
    for note in report.get("notes", ()):
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)
    if report["valid"]:
        checked = "structure, config and values" if report.get("values_checked") else "structure and config; values not"
        mixers = report.get("layer_types")
        if mixers:
            console.print("decoder layers: " + ", ".join(f"{n} {t.replace('_', ' ')}" for t, n in mixers.items()))
            if report.get("mtp_tensors"):
                console.print(f"multi-token-prediction head: {report['mtp_tensors']} mtp.* tensors stored "
                              "(drafts for --speculate mtp)")
        console.print(f"[green]valid[/green] ({checked} checked); runs as {report['architecture']}")
    else:
        console.print(f"[red]{report['status']}:[/red] {report['error']}", highlight=False, soft_wrap=True)
