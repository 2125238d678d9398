"""A loaded model with its tokenizer: prompts and chat messages in, streamed text out."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import torch

from ..checkpoint.errors import CheckpointError
from ..checkpoint.files import check_entries, read_json_object, regular_file
from .generate import SamplingParams, generate
from .loader import load_planned
from .model import Transformer
from .plan import plan_checkpoint

GENERATION_CONFIG = "generation_config.json"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but no CUDA GPU is available")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]
    if device.type == "cpu":
        return torch.float32
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def load_tokenizer(path: str | Path, vocab_size: int | None = None):
    """The checkpoint's tokenizer, refused with a one-line ``CheckpointError`` when it is missing, corrupt or
    unloadable, or when it has more tokens than the model's ``vocab_size`` (their ids would index past the
    embeddings). Checked before the weights are loaded."""
    from transformers import AutoTokenizer

    root = Path(path)
    check_entries(root)  # a FIFO or a link loop among the tokenizer's files would hang or fail inside transformers
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except Exception as e:  # transformers raises many types (OSError, ValueError, JSONDecodeError, ...)
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"cannot load the tokenizer: {type(e).__name__}: {first_line}", file=root) from None
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise CheckpointError(f"the tokenizer has {len(tokenizer)} tokens but config.json 'vocab_size' is "
                              f"{vocab_size}: token ids past it have no embedding", file=root)
    return tokenizer


def checkpoint_stop_ids(path: Path, tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS and ``generation_config.json``'s ``eos_token_id`` (an id or a list of ids)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = Path(path) / GENERATION_CONFIG
    if regular_file(gen):
        eos = read_json_object(gen).get("eos_token_id")
        listed = eos if isinstance(eos, list) else [eos]
        if eos is not None and not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in listed):
            raise CheckpointError(f"'eos_token_id' must be a token id or a list of token ids, found {eos!r}",
                                  file=gen)
        ids.update(e for e in listed if e is not None)
    return tuple(sorted(ids))


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for the reply."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise SystemExit("this checkpoint's tokenizer has no chat template; use `anyfp4 generate` with a raw prompt")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@dataclass
class Session:
    model: Transformer
    tokenizer: object
    stop_token_ids: tuple[int, ...]
    compile_decode: bool = False
    draft_tokens: int = 0  # > 0: a single prompt is decoded speculatively with this many drafts per step
    draft_model: Transformer | None = None  # None: prompt-lookup drafts
    last_stats: object = None  # the SpecStats of the last speculative reply

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", dtype: str = "auto", progress: bool = True,
             compile_decode: bool = False) -> "Session":
        dev = pick_device(device)
        plan = plan_checkpoint(path)  # config against tensors, from the headers: nothing loaded yet
        tokenizer = load_tokenizer(path, plan.args.vocab_size)
        stops = checkpoint_stop_ids(Path(path), tokenizer)
        model = load_planned(plan, dev, pick_dtype(dtype, dev), progress=progress)
        return cls(model, tokenizer, stops, compile_decode)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def complete(self, prompts: list[list[int]], params: SamplingParams, stream: TextIO | None = None) -> list[str]:
        """Generate for each prompt; with ``stream`` (one prompt only) print text as it is produced."""
        params = replace(params, stop_token_ids=params.stop_token_ids or self.stop_token_ids)
        shown = [""]
        produced: list[int] = []

        def show(new: list[int]) -> None:
            produced.extend(new)
            text = self.tokenizer.decode([t for t in produced if t not in params.stop_token_ids],
                                         skip_special_tokens=True)
            stream.write(text[len(shown[0]):])
            stream.flush()
            shown[0] = text

        streaming = stream is not None and len(prompts) == 1
        if self.draft_tokens and len(prompts) == 1:
            from .speculative import generate_speculative

            tokens, self.last_stats = generate_speculative(self.model, prompts[0], params, self.draft_tokens,
                                                           self.draft_model, show if streaming else None)
            out = [tokens]
        else:
            out = generate(self.model, prompts, params, (lambda step: show(step[:1])) if streaming else None,
                           compile_decode=self.compile_decode)
        if stream is not None and len(prompts) == 1:
            stream.write("\n")
        return [self.tokenizer.decode([t for t in o if t not in params.stop_token_ids], skip_special_tokens=True)
                for o in out]


def chat_loop(session: Session, params: SamplingParams, system: str | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None, after_reply=None) -> None:
    """Interactive chat: one user turn per line, the conversation kept; empty line or EOF ends it.
    ``after_reply`` is called after each reply (e.g. to report speculation statistics)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    messages = [{"role": "system", "content": system}] if system else []
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or not line.strip():
            return
        messages.append({"role": "user", "content": line.strip()})
        reply = session.complete([session.encode_chat(messages)], params, stream=stdout)[0]
        messages.append({"role": "assistant", "content": reply})
        if after_reply is not None:
            after_reply()
