"""A loaded model with its tokenizer: prompts and chat messages in, streamed text out."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import torch

from .generate import SamplingParams, generate
from .loader import load_model
from .model import Transformer


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


def checkpoint_stop_ids(path: Path, tokenizer) -> tuple[int, ...]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
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
        from transformers import AutoTokenizer

        dev = pick_device(device)
        model, _ = load_model(path, dev, pick_dtype(dtype, dev), progress=progress)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(model, tokenizer, checkpoint_stop_ids(Path(path), tokenizer), compile_decode)

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
