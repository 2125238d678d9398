"""Small checkpoints made on the fly for tests: a random Llama-shaped float model and mutations of it."""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from anyfp4.formats.fp8 import FP8Weight

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def llama_tensors(config: dict, seed: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim", h // config["num_attention_heads"])
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    t = {"model.embed_tokens.weight": rnd(v, h, scale=1.0), "model.norm.weight": 1 + rnd(h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = 1 + rnd(h)
        t[p + "post_attention_layernorm.weight"] = 1 + rnd(h)
        t[p + "self_attn.q_proj.weight"] = rnd(q, h)
        t[p + "self_attn.k_proj.weight"] = rnd(kv, h, scale=0.1)
        t[p + "self_attn.v_proj.weight"] = rnd(kv, h, scale=0.02)
        t[p + "self_attn.o_proj.weight"] = rnd(h, q)
        t[p + "mlp.gate_proj.weight"] = rnd(i, h)
        t[p + "mlp.up_proj.weight"] = rnd(i, h, scale=0.08)
        t[p + "mlp.down_proj.weight"] = rnd(h, i)
    if not config.get("tie_word_embeddings"):
        t["lm_head.weight"] = rnd(v, h)
    return t


def write_float_checkpoint(path: Path, config: dict | None = None, seed: int = 0, dtype=torch.bfloat16) -> Path:
    config = dict(config or TINY_LLAMA)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    write_tiny_tokenizer(path, config["vocab_size"])
    save_file(llama_tensors(config, seed, dtype), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def write_tiny_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer of ``vocab_size`` tokens (``<unk>``, ``<s>``, ``</s>``, ``w3`` ..., and last
    ``<|endoftext|>``, which transformers' Qwen2 tokenizer would otherwise add): enough for AutoTokenizer
    and for generate / chat on tiny random checkpoints."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size - 1)},
             "<|endoftext|>": vocab_size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 256}))


def rewrite_tensors(path: Path, edit) -> None:
    """Load model.safetensors, let ``edit(dict)`` mutate it, save it back."""
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def to_compressed_tensors(modelopt_dir: Path, out: Path) -> Path:
    """The compressed-tensors twin of a ModelOpt NVFP4 checkpoint: renamed tensors, reciprocal global scales."""
    import shutil

    shutil.copytree(modelopt_dir, out)
    (out / "hf_quant_config.json").unlink()
    tensors = load_file(str(out / "model.safetensors"))
    twin = {}
    for name, t in tensors.items():
        module, _, suffix = name.rpartition(".")
        if suffix == "weight" and t.dtype == torch.uint8:
            twin[f"{module}.weight_packed"] = t
        elif suffix == "weight_scale_2":
            twin[f"{module}.weight_global_scale"] = (1.0 / t.double()).float()
        else:
            twin[name] = t
    save_file(twin, str(out / "model.safetensors"), metadata={"format": "pt"})
    ignore = json.loads((modelopt_dir / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    edit_json(out / "config.json", lambda c: c.update(quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ignore,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}}}}))
    return out


def pause_at(step: str, nth: int, control: Path):
    """A ``replace.reached`` hook that stops the process the ``nth`` time it reaches ``step``: it creates
    ``control/ready`` and waits (interruptibly) until ``control/go`` exists."""
    import time

    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == step:
            seen += 1
            if seen == nth:
                (control / "ready").touch()
                while not (control / "go").exists():
                    time.sleep(0.002)

    return hook


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``, by relative path: equal snapshots mean
    that nothing under ``root`` was created, deleted or changed."""
    tree: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        tree[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return tree


class ForkedCli:
    """``anyfp4 ARGV`` in a forked child process: it reuses this process's imports, so it starts in
    milliseconds, and it can be killed like any command. ``prepare()`` runs in the child first."""

    def __init__(self, argv: list[str], stderr: Path, prepare=None):
        import os
        import sys

        self.stderr = stderr
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into the test
            code = 99
            try:
                sys.stderr = open(stderr, "w", buffering=1)
                torch.set_num_threads(1)  # a forked OpenMP pool would hang
                if prepare is not None:
                    prepare()
                from anyfp4 import cli

                code = cli.main(argv)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        self.code: int | None = None

    def poll(self) -> int | None:
        import os

        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self, timeout: float = 60) -> int:
        import os
        import signal
        import time

        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise TimeoutError(f"anyfp4 did not end within {timeout} s")
            time.sleep(0.005)
        return self.code


def expect_refused(path: Path, fragment: str, capsys, names_file: str | None = None) -> str:
    """Both what ``generate`` runs (``Session.load``: plan, tokenizer, weights) and ``anyfp4 inspect`` refuse
    ``path``: a one-line CheckpointError holding ``fragment`` and naming a file (``names_file``, default the
    checkpoint directory), and inspect exiting 1 with the same message. Returns the message."""
    import pytest

    from anyfp4.checkpoint.errors import CheckpointError
    from anyfp4.cli import main
    from anyfp4.runtime.session import Session

    with pytest.raises(CheckpointError) as e:
        Session.load(path, "cpu", "fp32", progress=False)
    message = str(e.value)
    assert fragment in message and "\n" not in message, message
    assert f"file {names_file or path}" in message, message
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "invalid" and report["error"] == message, (report["error"], message)
    return message


@contextmanager
def hard_timeout(seconds: float):
    """Fail instead of hanging (main thread, POSIX): a blocked call such as open() of a FIFO is interrupted."""
    def fire(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def write_tokenizer(path: Path, vocab_size: int = 128, chat_template: str | None = CHAT_TEMPLATE,
                    eos: bool = True) -> Path:
    """A character-level tokenizer over ``vocab_size`` ids (printable ASCII, the rest filler tokens), so that
    the tiny checkpoints run through the whole command line; ``eos=False``: no end-of-sequence token."""
    from tokenizers import Tokenizer, decoders, models

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [chr(c) for c in range(32, 127)])}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), vocab_size)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "unk_token": "<unk>",
              "model_max_length": 256}
    if eos:
        config["eos_token"] = "</s>"
    if chat_template is not None:
        config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def write_runnable_checkpoint(path: Path, config: dict | None = None, stop_tokens: bool = True, **tokenizer) -> Path:
    """A tiny float checkpoint with a tokenizer: ``anyfp4 generate`` / ``chat`` run on it end to end;
    ``stop_tokens=False``: no EOS anywhere, so generation runs to ``--max-tokens``."""
    write_float_checkpoint(path, config)
    write_tokenizer(path, eos=stop_tokens, **tokenizer)
    if not stop_tokens:
        (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    return path


def random_fp8(n, k, gen, per_channel, device):
    raw = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=gen)
    raw = torch.where((raw & 0x7F) == 0x7F, raw & 0xF0, raw)  # no NaN bytes
    scale = torch.rand(n if per_channel else (), generator=gen) * 1e-2 + 1e-4
    return FP8Weight(raw.view(torch.float8_e4m3fn).to(device), scale.to(device))


def free_port() -> int:
    """A free local TCP port: the rendezvous of a test's tensor-parallel ranks."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_qwen3_5_config(width: int = 128, **overrides):
    """A small transformers ``Qwen3_5TextConfig``: four layers (three Gated DeltaNet, then gated full attention) of
    ``width`` with four query / two KV heads and 2 key / 4 value Gated DeltaNet heads, all of width / 4, an untied
    head, a vocabulary of 512; ``overrides`` replace any of these."""
    from transformers import Qwen3_5TextConfig

    d = width // 4
    fields = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, head_dim=d, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=d, linear_value_head_dim=d, tie_word_embeddings=False,
                  architectures=["Qwen3_5ForCausalLM"])
    return Qwen3_5TextConfig(**{**fields, **overrides})


def tiny_qwen3_5_vision_language_config(width: int = 128, **text_overrides):
    """A small transformers ``Qwen3_5Config`` (``Qwen3_5ForConditionalGeneration``): ``tiny_qwen3_5_config``'s text
    model (256 positions) beside a one-block vision tower."""
    from transformers import Qwen3_5Config

    text = tiny_qwen3_5_config(width, **{"max_position_embeddings": 256, **text_overrides}).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def save_random_qwen3_5(path: Path, config, seed: int = 0) -> Path:
    """A ``Qwen3_5ForCausalLM`` of ``config`` with transformers' seeded random init, saved in bf16 at ``path``."""
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    Qwen3_5ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(path))
    return path


def with_random_mtp_head(src, config, seed=5):
    """Adds an MTP head of random weights (mtp.fc, its norms, one gated full-attention layer) to checkpoint ``src``."""
    gen = torch.Generator().manual_seed(seed)
    h, hd, heads, kv, inter = (config.hidden_size, config.head_dim, config.num_attention_heads,
                               config.num_key_value_heads, config.intermediate_size)
    shapes = {"mtp.fc.weight": (h, 2 * h), "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * hd, h),
              "mtp.layers.0.self_attn.k_proj.weight": (kv * hd, h), "mtp.layers.0.self_attn.v_proj.weight": (kv * hd, h),
              "mtp.layers.0.self_attn.o_proj.weight": (h, heads * hd), "mtp.layers.0.mlp.gate_proj.weight": (inter, h),
              "mtp.layers.0.mlp.up_proj.weight": (inter, h), "mtp.layers.0.mlp.down_proj.weight": (h, inter)}
    tensors = load_file(str(src / "model.safetensors"))
    for name, shape in shapes.items():
        tensors[name] = (torch.randn(shape, generator=gen) * shape[1] ** -0.5).to(torch.bfloat16)
    for name, size in [("mtp.pre_fc_norm_embedding.weight", h), ("mtp.pre_fc_norm_hidden.weight", h),
                       ("mtp.norm.weight", h), ("mtp.layers.0.input_layernorm.weight", h),
                       ("mtp.layers.0.post_attention_layernorm.weight", h), ("mtp.layers.0.self_attn.q_norm.weight", hd),
                       ("mtp.layers.0.self_attn.k_norm.weight", hd)]:
        tensors[name] = (0.1 * torch.randn(size, generator=gen)).to(torch.bfloat16)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    return src


def load_script(relative: str):
    """A script under benchmarks/ (``relative`` to it, e.g. "probes/mma_sweep.py") imported as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graphed_against_eager(model, monkeypatch, steps=6):
    """``steps`` decode steps after a 12-token prompt: eagerly with every early launch off, then replayed from a
    CUDA graph captured with them on (sm_90: each kernel of the step resident while the one before it finishes)."""
    from anyfp4.runtime.generate import decode_step

    prompt = torch.randint(0, model.args.vocab_size, (2, 12), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(1))
    results = {}
    for early, name in (("0", "eager"), ("1", "graph")):
        monkeypatch.setenv("ANYFP4_EARLY_LAUNCH", early)
        fn = model if name == "eager" else decode_step(model)
        model.setup_caches(2, 32)
        logits = model(prompt, torch.arange(12, device="cuda"))
        outs = []
        for i in range(steps):
            nxt = logits[:, -1].argmax(-1)
            logits = fn(nxt[:, None], torch.tensor([12 + i], device="cuda"))
            outs.append(logits.clone())
        results[name] = torch.stack(outs)
    return results["eager"], results["graph"]


def tiny_moe_config(arch: str, width: int = 128, **overrides):
    """A small transformers mixture-of-experts config: ``arch`` "qwen3_moe" (Qwen3-MoE: q/k norms, layer 1 of 3
    dense through ``mlp_only_layers``, top-k renormalized) or "mixtral" (every layer's MLP 8 experts, top 2); four
    query / two KV heads, 8 experts of width, an untied head, a vocabulary of 512."""
    import transformers as tf

    common = dict(hidden_size=width, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False, num_experts_per_tok=2)
    if arch == "qwen3_moe":
        fields = dict(common, intermediate_size=2 * width, moe_intermediate_size=width, num_experts=8, head_dim=32,
                      mlp_only_layers=[1], norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"])
        return tf.Qwen3MoeConfig(**{**fields, **overrides})
    fields = dict(common, intermediate_size=width, num_local_experts=8, architectures=["MixtralForCausalLM"])
    return tf.MixtralConfig(**{**fields, **overrides})


MOE_CLASSES = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


def save_random_moe(path: Path, arch: str, seed: int = 0, stop_tokens: bool = True) -> Path:
    """A ``tiny_moe_config(arch)`` model with transformers' seeded random init, saved in bf16 at ``path`` with the
    character tokenizer (512 ids); ``stop_tokens=False``: no end-of-sequence token, generation runs to its limit."""
    import transformers as tf

    torch.manual_seed(seed)
    getattr(tf, MOE_CLASSES[arch])(tiny_moe_config(arch)).to(torch.bfloat16).save_pretrained(str(path))
    write_tokenizer(path, vocab_size=512, eos=stop_tokens)
    if not stop_tokens:
        (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    return path


def copy_expert_weights(state_dict: dict, name: str, weight: torch.Tensor) -> bool:
    """Put a checkpoint's per-expert linear ``name`` (``...experts.E.{gate_proj,up_proj,down_proj}`` or Mixtral's
    ``block_sparse_moe.experts.E.{w1,w3,w2}``) into transformers' fused expert tensors (``mlp.experts.gate_up_proj``
    (E, 2 I, H): gate rows then up rows; ``mlp.experts.down_proj`` (E, H, I)). False if ``name`` is no expert's."""
    import re

    m = re.fullmatch(r"(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)", name)
    if m is None:
        return False
    prefix, e, which = m.group(1), int(m.group(2)), m.group(3)
    if which in ("down_proj", "w2"):
        state_dict[f"{prefix}.mlp.experts.down_proj"][e].copy_(weight)
        return True
    fused = state_dict[f"{prefix}.mlp.experts.gate_up_proj"][e]
    rows = fused.shape[0] // 2
    (fused[:rows] if which in ("gate_proj", "w1") else fused[rows:]).copy_(weight)
    return True


def prompt_rows(model, prompts, step, step_tokens):
    """Each row's last logits and final-norm outputs at its own positions after its left-padded prompt, laid out as
    ``generate`` lays it out and run by ``runtime.prompt.run_prompt`` through ``step`` in steps of ``step_tokens``
    tokens per row (None: one forward)."""
    from anyfp4.runtime.generate import cache_slots, left_padded
    from anyfp4.runtime.prompt import run_prompt

    longest = max(len(p) for p in prompts)
    slots = cache_slots(model, longest, 8)
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, model.device)
    logits, hidden = run_prompt(model, tokens, step, step_tokens, rope if padded else None,
                                valid if padded else None, hidden=True)
    assert logits.shape == (len(prompts), 1, model.args.vocab_size) and hidden.shape[:2] == tokens.shape
    return [(logits[i].clone(), hidden[i, longest - len(p):].clone()) for i, p in enumerate(prompts)]


def padded_steps(model, prompts, steps):
    """Each row's logits and final-norm output (what the head reads) after its prompt and after each of ``steps``
    greedy tokens, in one left-padded batch laid out as ``generate`` lays it out."""
    from anyfp4.runtime.generate import left_padded

    device = model.device
    longest = max(len(p) for p in prompts)
    slots = longest + steps + 5  # longer than alone: the cache past a row's last position is not read
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, _ = left_padded(prompts, slots, device)
    out = []
    with torch.no_grad():
        logits, hidden = model(tokens, torch.arange(longest, device=device), rope, valid, hidden=True, last=True)
        for step in range(steps):
            out.append(torch.cat([logits[:, -1], hidden[:, -1]], -1))
            valid[:, longest + step] = True
            logits, hidden = model(logits[:, -1].argmax(-1)[:, None], torch.tensor([longest + step], device=device),
                                   rope[:, -1:] + 1 + step, valid, hidden=True)
    return torch.stack(out, 1)
