"""The commands of ``anyfp4``: each checks everything that needs no weights before it reads any, and
imports what it needs when it runs (so that building the parser and printing help import no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import InputError


# -- checks shared by the commands, all before any weights are read -----------------------------------------

def _sampling(args: argparse.Namespace):
    from ..runtime.generate import SamplingParams

    return SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed)


def _check_draft_tokens(args: argparse.Namespace) -> None:
    from ..runtime.generate import MAX_DRAFT_TOKENS

    if args.draft_tokens > MAX_DRAFT_TOKENS:
        raise InputError(f"--draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {args.draft_tokens}")


def _check_draft_model(draft: str | None, vocab_size: int) -> None:
    """``--speculate DRAFT_MODEL``: readable, supported and sharing the target's vocabulary (config only)."""
    if not draft or draft in ("ngram", "mtp"):
        return
    if not Path(draft).is_dir():
        raise InputError(f"--speculate {draft}: neither 'ngram', 'mtp' nor a checkpoint directory")
    from ..checkpoint.reader import CheckpointReader
    from ..runtime.config import ModelArgs

    draft_vocab = ModelArgs.from_hf(CheckpointReader(draft).config).vocab_size
    if draft_vocab != vocab_size:
        raise InputError(f"the draft model {draft} has another vocabulary ({draft_vocab} vs {vocab_size} tokens)")


def _read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise InputError("--prompt is empty")
        return [args.prompt]
    if sys.stdin.isatty():
        raise InputError("no prompt: give --prompt TEXT, or pipe prompts on standard input, one per line")
    texts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise InputError("standard input holds no prompt (one per line); give --prompt TEXT")
    return texts


# -- the commands -------------------------------------------------------------------------------------------

def threads_for(device):
    """On the CPU, torch's threads = the CPUs this process may use (affinity and a container's quota), unless
    OMP_NUM_THREADS says otherwise: more threads than CPUs spin against each other."""
    import os

    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        import torch

        from ..kernels.cpu.linear import available_cpus

        torch.set_num_threads(available_cpus())
    return device


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..checkpoint.writer import DEFAULT_EXCLUDE, QuantizeOptions, TargetFormat, max_shard_bytes, quantize_checkpoint
    from ..interrupts import Interrupted, signals_raise

    exclude = tuple(args.exclude) if args.no_default_exclude else DEFAULT_EXCLUDE + tuple(args.exclude)
    options = QuantizeOptions(format=TargetFormat(args.format), exclude=exclude,
                              max_shard_bytes=max_shard_bytes(args.max_shard_size), force=args.force,
                              progress=not args.quiet)
    try:
        with signals_raise():  # SIGINT / SIGTERM: the partial checkpoint is removed, DST stays whole
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


def cmd_inspect(args: argparse.Namespace) -> int:
    """Exit 0 valid, 1 invalid, 2 unreadable (and for an internal error: never 1, which is a verdict)."""
    from ..checkpoint.inspection import exit_code, inspect_checkpoint, print_report

    try:
        report = inspect_checkpoint(args.path, check_values=not args.headers_only, progress=not args.json)
    except Exception:  # a bug in anyfp4, not a verdict on the checkpoint
        import traceback

        traceback.print_exc()
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    if report["status"] == "unreadable":  # not even a checkpoint directory: bad input, not a verdict
        raise InputError(report["error"])
    if not args.json:
        print_report(report)
    return exit_code(report)


def _open_session(args: argparse.Namespace, prompts_of):
    """The checkpoint's config and tokenizer, the prompts ``prompts_of(session)`` encodes checked against the
    context, the draft model's config checked: everything but the weights. Returns (session, prompts, params)."""
    from ..runtime.session import Session

    params = _sampling(args)
    _check_draft_tokens(args)
    session = Session.open(args.model, compile_decode=args.compile)
    session.draft_tokens = args.draft_tokens if args.speculate else 0
    prompts = prompts_of(session)
    session.check_fits(prompts, params)
    _check_draft_model(args.speculate, session.args.vocab_size)
    if args.speculate == "mtp":
        from ..runtime.plan import plan_mtp

        session.mtp_plan = plan_mtp(session.plan)  # the head checked against the config before any weight is read
    return session, prompts, params


def _load_weights(session, args: argparse.Namespace, device) -> None:
    session.load_weights(device, args.dtype, progress=not args.quiet)
    if args.speculate == "mtp":
        from ..runtime.loader import load_mtp

        session.mtp_head = load_mtp(session.mtp_plan, session.model.device, session.model.dtype)
    elif args.speculate and args.speculate != "ngram":
        from ..runtime.loader import load_model

        session.draft_model, _ = load_model(args.speculate, session.model.device, session.model.dtype,
                                            progress=False)


def _print_speculation(session, args: argparse.Namespace) -> None:
    stats = session.last_stats
    if stats is not None:
        print(f"[speculation: {stats.verify_steps} verify steps, acceptance length {stats.acceptance_length:.2f} "
              f"of {args.draft_tokens}]", file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..runtime.session import pick_device

    if args.tp > 1 and args.speculate:
        raise InputError("--speculate runs on one device only (not with --tp)")
    texts = _read_prompts(args)
    if args.speculate and len(texts) != 1:
        raise InputError(f"--speculate runs one prompt, standard input held {len(texts)}")
    device = threads_for(pick_device(args.device))

    def encode(session):
        return [session.encode_chat([{"role": "user", "content": t}]) if args.chat else session.encode(t)
                for t in texts]

    session, prompts, params = _open_session(args, encode)
    if args.tp > 1:
        return _generate_tp(args, session, prompts, params, device)
    _load_weights(session, args, device)
    if len(prompts) == 1:
        session.complete(prompts, params, stream=sys.stdout, status=sys.stderr)
        if args.speculate:
            _print_speculation(session, args)
    else:
        for text in session.complete(prompts, params, status=sys.stderr):
            print(text)
    return 0


def _generate_tp(args: argparse.Namespace, session, prompts: list[list[int]], params, device) -> int:
    from dataclasses import replace

    from ..parallel.model import generate_tp
    from ..runtime.session import pick_dtype

    dtype = str(pick_dtype(args.dtype, device)).replace("torch.", "")
    stops = session.stop_token_ids
    outs = generate_tp(args.model, prompts, replace(params, stop_token_ids=stops), args.tp, device.type, dtype)
    for out in outs:
        print(session.tokenizer.decode([t for t in out if t not in stops], skip_special_tokens=True))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ..runtime.session import chat_loop, pick_device

    device = threads_for(pick_device(args.device))
    opening = [{"role": "system", "content": args.system}] if args.system else []
    # the shortest conversation (an empty first turn) must leave room for --max-tokens
    session, _, params = _open_session(
        args, lambda s: [s.encode_chat(opening + [{"role": "user", "content": ""}])])
    _load_weights(session, args, device)
    print("anyfp4 chat: type a message and press enter; Ctrl-C stops a reply; an empty line or Ctrl-D ends "
          "the chat.")
    chat_loop(session, params, system=args.system, stderr=sys.stderr,
              after_reply=(lambda: _print_speculation(session, args)) if args.speculate else None)
    return 0


def _check_bench_spec(spec, args: argparse.Namespace) -> None:
    """A model ``bench`` would run (a ``RandomSpec`` or a checkpoint directory), checked from its random
    architecture or its config: no weights."""
    from ..bench.random_model import RandomSpec
    from ..runtime.generate import check_context

    if isinstance(spec, RandomSpec):
        model_args = spec.args()
    else:
        from ..checkpoint.reader import CheckpointReader
        from ..runtime.config import ModelArgs

        model_args = ModelArgs.from_hf(CheckpointReader(spec).config)
    speculate = args.draft_tokens if args.speculate else 0
    check_context(args.prompt_len, args.gen_len, model_args.max_position_embeddings, speculate)
    _check_draft_model(args.speculate, model_args.vocab_size)


def _bench_spec(model: str):
    """A model argument of ``bench``: a checkpoint directory, or a random-weight model by name."""
    from ..bench.random_model import RandomSpec

    return RandomSpec.parse(model) or model


def _mtp_head(spec, device, dtype):
    """``bench --speculate mtp``: the checkpoint's MTP head, or a random one for a random hybrid."""
    from ..bench.random_model import RandomSpec, random_mtp_head

    if isinstance(spec, RandomSpec):
        try:
            return random_mtp_head(spec.arch, spec.fmt, device, dtype)
        except ValueError as e:
            raise InputError(str(e)) from None
    from ..runtime.loader import load_mtp
    from ..runtime.plan import plan_checkpoint, plan_mtp

    return load_mtp(plan_mtp(plan_checkpoint(spec)), device, dtype)


def _bench_one(spec, args: argparse.Namespace, device, dtype) -> dict:
    from ..bench.model import bench_model
    from ..bench.random_model import RandomSpec
    from ..runtime.loader import load_model

    if isinstance(spec, RandomSpec):
        model = spec.model(device, dtype, progress=not args.json)
    else:
        model, _ = load_model(spec, device, dtype, progress=not args.json)
    draft = mtp = None
    if args.speculate == "mtp":
        mtp = _mtp_head(spec, device, dtype)
    elif args.speculate and args.speculate != "ngram":
        draft, _ = load_model(args.speculate, device, dtype, progress=False)
    result = {"model": str(spec), **bench_model(model, args.prompt_len, args.gen_len, args.batch,
                                                compile_decode=args.compile,
                                                speculate=args.draft_tokens if args.speculate else 0,
                                                draft_model=draft, mtp=mtp)}
    del model
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    return result


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.random_model import QUANTIZED_HEAD, RandomSpec
    from ..bench.timing import copy_bandwidth
    from ..runtime.session import pick_device, pick_dtype

    if (args.model is None) == (args.random_weights is None):
        raise InputError("give a checkpoint directory or --random-weights ARCH (not both)")
    if args.quantized_lm_head and not args.random_weights:
        raise InputError("--quantized-lm-head is for --random-weights (a checkpoint says itself)")
    if args.tp > 1 and (args.speculate or args.compile):
        raise InputError("--speculate and --compile run on one device only (not with --tp)")
    if args.speculate and args.batch != 1:
        raise InputError("--speculate runs batch 1")
    _check_draft_tokens(args)
    head = QUANTIZED_HEAD if args.quantized_lm_head else ""
    specs = [_bench_spec(args.model) if args.model else RandomSpec(args.random_weights, args.format + head)]
    if args.compare:
        # with --random-weights, --compare names a second format (e.g. bf16) unless it is a directory
        other_format = args.random_weights and not Path(args.compare).is_dir()
        specs.append(RandomSpec(args.random_weights, args.compare) if other_format else _bench_spec(args.compare))
    for spec in specs:
        _check_bench_spec(spec, args)
    device = threads_for(pick_device(args.device))
    dtype = pick_dtype(args.dtype, device)
    copy = copy_bandwidth(device)
    if args.tp > 1:
        from ..bench.tensor_parallel import bench_tp

        dtype_name = str(dtype).replace("torch.", "")
        results = [bench_tp(spec, args.tp, device.type, dtype_name, args.prompt_len, args.gen_len, args.batch,
                            args.port) for spec in specs]
    else:
        results = [_bench_one(spec, args, device, dtype) for spec in specs]
    for r in results:
        r["copy_bandwidth_GBps"] = copy / 1e9 if copy else None
        r["pct_of_copy"] = 100 * r["bandwidth_GBps"] * 1e9 / copy if copy else None
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return 0
    for r in results:
        _print_bench(r)
    if len(results) == 2:
        print(f"decode speed-up {results[0]['model']} / {results[1]['model']}: "
              f"{results[0]['decode_tok_s'] / results[1]['decode_tok_s']:.2f}x")
    return 0


def _print_bench(r: dict) -> None:
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


DEMO_ANSWERS = ("bf16", "fp8", "nvfp4")  # the formats that answer the demo's prompt, smallest model last
WHY_4BIT_HURTS = ("4-bit weights cost a 135M model more than a large one: it has little redundancy to absorb the "
                  "rounding, and this one was shipped as Q4_1, so NVFP4 rounds it a second time; FP8 keeps it close")


def cmd_demo(args: argparse.Namespace) -> int:
    """Quantize SmolLM2-135M-Instruct, inspect the ``--format`` checkpoint, then let the bf16 original and each
    quantized format answer the prompt, with the bytes each reads per token."""
    from ..checkpoint.inspection import inspect_checkpoint, print_report
    from ..demo import smollm2_bf16, smollm2_quantized
    from ..runtime.generate import SamplingParams
    from ..runtime.session import Session, pick_device

    device = threads_for(pick_device(args.device))
    params = SamplingParams(max_new_tokens=args.max_tokens)
    formats = DEMO_ANSWERS if args.format in DEMO_ANSWERS else (*DEMO_ANSWERS, args.format)
    paths = {f: smollm2_bf16(progress=True) if f == "bf16" else smollm2_quantized(f, progress=True) for f in formats}
    print(f"SmolLM2-135M-Instruct ({args.format}) checkpoint: {paths[args.format]}")
    report = inspect_checkpoint(paths[args.format])
    print_report(report)
    if not report["valid"]:
        return 1
    print(f"\nuser: {args.prompt}")
    for fmt in formats:
        session = Session.open(paths[fmt])
        prompt = session.encode_chat([{"role": "user", "content": args.prompt}])
        session.check_fits([prompt], params)
        session.load_weights(device, "auto", progress=False)
        read = inspect_checkpoint(paths[fmt], check_values=False)["bytes_per_token"]
        print(f"{fmt:>6} ({read / 1e6:5.1f} MB read per token, {session.model.device}): ", end="", flush=True)
        session.complete([prompt], params, stream=sys.stdout, status=sys.stderr)
    print(f"({WHY_4BIT_HURTS})")
    return 0
