"""A checkpoint opened for generation: its config and tokenizer first, then its weights; prompts and chat
messages in, streamed text out."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import torch

from ..checkpoint.errors import CheckpointError
from ..checkpoint.files import check_entries, read_json_object, regular_file
from .config import ModelArgs
from .generate import SamplingParams, check_context, generate
from .loader import load_planned
from .model import Transformer
from .mtp import MTPHead
from .plan import ModelPlan, plan_checkpoint
from .rate_line import RateLine
from .reply_decode import ReplyDecoder, settled_length, whole_text

GENERATION_CONFIG = "generation_config.json"


def pick_device(name: str) -> torch.device:
    """``auto`` (a CUDA GPU if there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; a ValueError
    for a device this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: give auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: anyfp4 runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but no CUDA GPU is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
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
        raise ValueError("this checkpoint's tokenizer has no chat template; use `anyfp4 generate` with a raw prompt")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@dataclass
class Session:
    """A checkpoint's tokenizer and config (``open``), then its weights (``load_weights``): prompts can be
    encoded and checked against the context before the weights are read."""

    path: Path
    args: ModelArgs
    tokenizer: object
    stop_token_ids: tuple[int, ...]
    plan: ModelPlan | None = None  # config against tensors, from the headers (open); the loader builds from it
    model: Transformer | None = None
    compile_decode: bool = False
    draft_tokens: int = 0  # > 0: a single prompt is decoded speculatively with this many drafts per step
    draft_model: Transformer | None = None  # None: prompt-lookup drafts (or the MTP head's)
    mtp_plan: ModelPlan | None = None  # --speculate mtp: the checkpoint's multi-token-prediction head, planned
    mtp_head: MTPHead | None = None  # and loaded: its drafts
    last_stats: object = None  # the SpecStats of the last speculative reply

    @classmethod
    def open(cls, path: str | Path, compile_decode: bool = False) -> "Session":
        """The config checked against the stored tensors (an unsupported or inconsistent checkpoint is refused
        here) and the tokenizer; no weights yet."""
        path = Path(path)
        plan = plan_checkpoint(path)
        tokenizer = load_tokenizer(path, plan.args.vocab_size)
        return cls(path, plan.args, tokenizer, checkpoint_stop_ids(path, tokenizer), plan=plan,
                   compile_decode=compile_decode)

    def load_weights(self, device: str | torch.device = "auto", dtype: str = "auto",
                     progress: bool = True) -> "Session":
        dev = device if isinstance(device, torch.device) else pick_device(device)
        self.model = load_planned(self.plan, dev, pick_dtype(dtype, dev), progress=progress)
        return self

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", dtype: str = "auto", progress: bool = True,
             compile_decode: bool = False) -> "Session":
        return cls.open(path, compile_decode).load_weights(device, dtype, progress)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def check_fits(self, prompts: list[list[int]], params: SamplingParams) -> None:
        """A ValueError when a prompt would run past the model's context (or is empty), before any work."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        draft_tokens = self.draft_tokens if len(prompts) == 1 else 0
        check_context(max(len(p) for p in prompts), params.max_new_tokens, self.args.max_position_embeddings,
                      draft_tokens)

    def with_stop_tokens(self, params: SamplingParams) -> SamplingParams:
        """``params`` stopping at the checkpoint's stop tokens, unless they name their own."""
        return replace(params, stop_token_ids=params.stop_token_ids or self.stop_token_ids)

    def reply_text(self, tokens: list[int], params: SamplingParams) -> str:
        """The text of generated ``tokens``: stop tokens dropped, special tokens skipped."""
        return whole_text(self.tokenizer, tokens, params.stop_token_ids)

    def reply_decoder(self, params: SamplingParams) -> ReplyDecoder:
        """``reply_text`` of a growing token list, token by token (its ``text(tokens)``)."""
        return ReplyDecoder(self.tokenizer, params.stop_token_ids)

    def complete(self, prompts: list[list[int]], params: SamplingParams, stream: TextIO | None = None,
                 status: TextIO | None = None) -> list[str]:
        """Generate for each prompt; with ``stream`` (one prompt only) print text as it is produced; on a
        terminal ``status`` (stderr) shows the tokens so far and their rate while they come."""
        params = self.with_stop_tokens(params)
        streaming = stream is not None and len(prompts) == 1
        rate = RateLine(status, stream if streaming else None)
        shown = [""]
        produced: list[int] = []
        decoder = self.reply_decoder(params) if streaming else None

        def write(text: str) -> None:
            rate.before_text()
            stream.write(text[len(shown[0]):])
            stream.flush()
            rate.after_text(text[len(shown[0]):])
            shown[0] = text

        def show(new: list[int]) -> None:  # the text the next tokens cannot change (``settled_length``)
            produced.extend(new)
            text = decoder.text(produced)
            write(text[:settled_length(text, decoder.hold_back)])
            rate.add(len(new))

        def count(step: list[int]) -> None:
            rate.add(len(step))

        on_tokens = show if streaming else count
        try:
            if self.draft_tokens and len(prompts) == 1:
                from .speculative import generate_speculative

                tokens, self.last_stats = generate_speculative(self.model, prompts[0], params, self.draft_tokens,
                                                               self.draft_model, on_tokens, mtp=self.mtp_head)
                out = [tokens]
            else:
                out = generate(self.model, prompts, params, (lambda step: show(step[:1])) if streaming else count,
                               compile_decode=self.compile_decode)
        finally:
            if streaming and produced:  # what was held back, also from an interrupted reply
                text = self.reply_text(produced, params)
                if text.startswith(shown[0]):
                    write(text)
            rate.erase()
            if streaming:
                stream.write("\n")  # also after an interrupted reply: what follows starts on a line of its own
                stream.flush()
        return [self.reply_text(o, params) for o in out]


class _Transcript:
    """A text stream that also keeps what was written: what an interrupted reply had said."""

    def __init__(self, stream: TextIO):
        self.stream, self.text = stream, ""

    def write(self, text: str) -> int:
        self.text += text
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()


REPLY_STOPPED = "[reply stopped; the chat goes on: an empty line or Ctrl-D ends it]"


def chat_loop(session: Session, params: SamplingParams, system: str | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None, after_reply=None,
              stderr: TextIO | None = None) -> None:
    """Interactive chat: one user turn per line, the conversation kept; an empty line or EOF ends it.
    Ctrl-C during a reply stops that reply (what it had said stays in the conversation, with a note on
    ``stderr``) and the chat goes on; Ctrl-C at the prompt propagates. ``after_reply`` is called after each
    completed reply (e.g. to report speculation statistics)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    messages = [{"role": "system", "content": system}] if system else []
    while True:
        stdout.write("> ")
        stdout.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            stdout.write("\n")
            raise
        if not line or not line.strip():
            return
        messages.append({"role": "user", "content": line.strip()})
        transcript = _Transcript(stdout)
        try:
            reply = session.complete([session.encode_chat(messages)], params, stream=transcript, status=stderr)[0]
        except KeyboardInterrupt:
            reply = transcript.text.strip()
            if not reply:
                messages.pop()  # nothing was said: the turn is forgotten
            else:
                messages.append({"role": "assistant", "content": reply})
            stderr.write(REPLY_STOPPED + "\n")
            stderr.flush()
            continue
        messages.append({"role": "assistant", "content": reply})
        if after_reply is not None:
            after_reply()
