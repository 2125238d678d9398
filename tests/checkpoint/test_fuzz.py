"""Fuzzing safetensors headers and config.json values of tiny checkpoints (float and NVFP4).

For every case: ``inspect`` returns a verdict and never raises; what ``generate`` loads (``Session.load``:
config against tensors, tokenizer, weights) either refuses with a one-line ``CheckpointError``
(``UnsupportedModelError`` included) or builds a model whose logits are finite; inspect calls "valid"
exactly what generate loads; nothing hangs (a hard per-case timeout). Deterministic
(``derandomize``) and bounded: 2 x 200 cases, well under a minute on one CPU core.
"""

import json
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.inspection import inspect_checkpoint
from anyfp4.checkpoint.writer import QuantizeOptions, quantize_checkpoint
from anyfp4.runtime.session import Session
from helpers import edit_json, hard_timeout, write_float_checkpoint

CASE_SECONDS = 20
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
DELETE = object()


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    src = write_float_checkpoint(root / "float", dtype=torch.float32)
    nvfp4 = quantize_checkpoint(src, root / "nvfp4", QuantizeOptions(progress=False)).dst
    return {"float": src, "nvfp4": nvfp4}


def check_case(path: Path) -> None:
    """The properties every mutated checkpoint must have."""
    with hard_timeout(CASE_SECONDS):
        report = inspect_checkpoint(path)  # never raises for a bad checkpoint
        try:
            model = Session.load(path, "cpu", "fp32", progress=False).model
        except CheckpointError as e:
            event(f"refused: {str(e).split(' (file')[0][:40]}")
            assert "\n" not in str(e)
            assert not report["valid"], f"inspect said valid, the loader refused: {e}"
            return
        assert report["valid"], f"the loader built a model inspect refused: {report['error']}"
        event("loaded and ran")
        slots = min(8, model.args.max_position_embeddings)
        model.setup_caches(1, slots)
        tokens = torch.tensor([[1, 5, 9, 3][:slots]])
        with torch.no_grad():
            logits = model(tokens, torch.arange(tokens.shape[1]))
        assert torch.isfinite(logits).all(), "a load that succeeded gives non-finite logits"


def mutated(base: Path, mutate) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-"))
    path = Path(shutil.copytree(base, tmp / "ckpt"))
    mutate(path)
    return path


# --- config.json values ---------------------------------------------------------------------------------

json_leaf = (st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8)
             | st.sampled_from([0, 1, -1, 2, 3, 16, 32, 64, 96, 128, 256, 1e-5, 0.5, 1e30, "30", "llama"]))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
number = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-4, 2**20)
rope = st.fixed_dictionaries({"rope_type": st.sampled_from(["llama3", "default", "yarn", "linear"])},
                             optional={"factor": number, "low_freq_factor": number, "high_freq_factor": number,
                                       "original_max_position_embeddings": json_leaf})
quant = st.fixed_dictionaries({"quant_method": st.sampled_from(["modelopt", "compressed-tensors", "gptq"])},
                              optional={"quant_algo": st.sampled_from(["NVFP4", "FP8", "MIXED_PRECISION"]) | json_leaf,
                                        "format": st.sampled_from(["nvfp4-pack-quantized", "float-quantized"]),
                                        "ignore": st.lists(st.sampled_from(["lm_head", "re:(", "re:.*", "*", "model"]))
                                        | json_leaf, "config_groups": json_value})
KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
        "tie_word_embeddings", "attention_bias", "mlp_bias", "model_type", "architectures", "hidden_act",
        "sliding_window", "num_local_experts", "rope_parameters"]
PLAUSIBLE = {"vocab_size": [128, 127, 129, 64], "hidden_size": [64, 32, 128, 63], "intermediate_size": [96, 95, 48],
             "num_hidden_layers": [1, 2, 3], "num_attention_heads": [4, 2, 8, 3], "num_key_value_heads": [2, 1, 4],
             "head_dim": [16, 8, 32, 15], "rms_norm_eps": [1e-5, 1e-6, 0.5, 1e-30], "rope_theta": [1e4, 1.0, 1e6, 0.5],
             "max_position_embeddings": [256, 8, 4, 1], "tie_word_embeddings": [True, False],
             "attention_bias": [True, False], "mlp_bias": [True, False],
             "model_type": ["llama", "mistral", "qwen2", "qwen3", "mixtral"],
             "architectures": [["LlamaForCausalLM"], ["MistralForCausalLM"], ["Qwen2ForCausalLM"], ["Qwen3ForCausalLM"],
                               ["MixtralForCausalLM"], []],
             "hidden_act": ["silu", "gelu"], "sliding_window": [4, 4096, None], "num_local_experts": [0, 8],
             "rope_parameters": [{"rope_theta": 1e4}, {"rope_type": "default"}, None]}
plausible = st.sampled_from(KEYS).flatmap(lambda k: st.tuples(st.just(k), st.sampled_from(PLAUSIBLE[k])))
edit = st.one_of(plausible, plausible, plausible, st.tuples(st.sampled_from(KEYS), json_value | st.just(DELETE)),
                 st.tuples(st.just("rope_scaling"), rope), st.tuples(st.just("quantization_config"), quant))


def apply_edits(edits):
    def change(config: dict) -> None:
        for key, value in edits:
            if value is DELETE:
                config.pop(key, None)
            else:
                config[key] = value
    return change


@FUZZ
@given(base=st.sampled_from(["float", "nvfp4"]), edits=st.lists(edit, min_size=1, max_size=3),
       whole=st.one_of(*[st.none()] * 9, json_value))
def test_fuzz_config_json(bases, base, edits, whole):
    def mutate(path: Path) -> None:
        if whole is not None and not isinstance(whole, dict):
            (path / "config.json").write_text(json.dumps(whole))
        else:
            edit_json(path / "config.json", apply_edits(edits))
    check_case(mutated(bases[base], mutate))


# --- safetensors headers --------------------------------------------------------------------------------

SAME_SIZE = {1: ["U8", "I8", "F8_E4M3", "F8_E5M2", "BOOL"], 2: ["BF16", "F16", "I16", "U16"], 4: ["F32", "I32"],
             8: ["F64", "I64"]}
ITEMSIZE = {d: n for n, names in SAME_SIZE.items() for d in names}


def split(raw: bytes) -> tuple[dict, dict[str, bytes]]:
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return header, {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def join(header: dict, blobs: dict[str, bytes]) -> bytes:
    """A well-formed file again: the entries of ``header`` (dtype, shape as mutated), offsets recomputed."""
    out, data = {k: v for k, v in header.items() if k == "__metadata__"}, b""
    for name, blob in blobs.items():
        out[name] = dict(header[name], data_offsets=[len(data), len(data) + len(blob)])
        data += blob
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def reshaped(shape: list[int], pick: int) -> list[int]:
    numel = 1
    for d in shape:
        numel *= d
    divisors = [d for d in range(1, numel + 1) if numel % d == 0] or [1]
    a = divisors[pick % len(divisors)]
    return [[numel], [a, numel // a], [numel // a, a], [a, 1, numel // a], []][pick % 5] if numel else [0]


def header_mutation(kind: str, pick: int, value, nan: bool) -> "callable":
    def mutate(path: Path) -> None:
        file = path / "model.safetensors"
        raw = file.read_bytes()
        header, blobs = split(raw)
        names = list(blobs)
        name, other = names[pick % len(names)], names[(pick // 7) % len(names)]
        entry = header[name]
        if kind == "retype":
            same = SAME_SIZE[ITEMSIZE[entry["dtype"]]]
            entry["dtype"] = same[(pick // 3) % len(same)]
        elif kind == "reshape":
            entry["shape"] = reshaped(entry["shape"], pick // 5)
        elif kind == "swap":
            header[name], header[other] = header[other], header[name]
            blobs[name], blobs[other] = blobs[other], blobs[name]
        elif kind in ("rename", "drop", "copy"):
            new = name.replace("layers.1", "layers.2") if pick % 3 == 0 else \
                name.rpartition(".")[0] + (".bias", ".weight_scale", ".experts.0.weight")[pick % 3]
            blob = blobs.pop(name) if kind != "copy" else blobs[name]
            if kind != "drop":
                header[new], blobs[new] = dict(entry), blob
        elif kind == "data-bytes":  # an element of all-ones bytes (NaN in every float format) or random bytes
            b, size = bytearray(blobs[name]), ITEMSIZE[entry["dtype"]]
            at = (pick * 7919 % max(len(b) // size, 1)) * size
            b[at:at + size] = b"\xff" * size if nan else bytes((pick >> (8 * i)) % 256 for i in range(size))
            blobs[name] = bytes(b)
        elif kind == "entry":
            header[name] = value if pick % 2 else dict(entry, **({"dtype": value} if pick % 4 == 1 else {"shape": value}))
        elif kind == "metadata":
            header["__metadata__"] = value
        if kind == "length":
            file.write_bytes(struct.pack("<Q", pick) + raw[8:])
        elif kind == "truncate":
            file.write_bytes(raw[:pick % len(raw)])
        elif kind in ("offsets", "entry", "metadata"):  # the header as mutated over the original data
            if kind == "offsets":
                entry["data_offsets"] = value
            n = struct.unpack("<Q", raw[:8])[0]
            text = json.dumps(header).encode()
            file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
        else:
            file.write_bytes(join(header, blobs))
    return mutate


@FUZZ
@given(base=st.sampled_from(["float", "nvfp4"]),
       kind=st.sampled_from(["retype", "reshape", "swap", "rename", "drop", "copy", "data-bytes", "retype", "reshape",
                             "data-bytes", "data-bytes", "entry", "metadata", "length", "truncate", "offsets"]),
       pick=st.integers(0, 2**64 - 1), nan=st.booleans(),
       value=json_value | st.lists(st.integers(-2, 2**33), min_size=0, max_size=4))
def test_fuzz_safetensors_headers(bases, base, kind, pick, nan, value):
    check_case(mutated(bases[base], header_mutation(kind, pick, value, nan)))
