"""The ``anyfp4`` command line: ``parser`` (options, help, usage errors), ``commands`` (what each command
does, every check that needs no weights first) and ``errors`` (exit codes, one-line messages, Ctrl-C and
SIGTERM). Building the parser and printing help import no torch."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    import os

    from .errors import run_command
    from .parser import build_parser

    # Before torch starts its OpenMP threads: idle threads sleep instead of spinning. Spinning threads of a
    # process that shares its CPUs with another busy one take turns for the cores at every one of a decode
    # step's hundreds of parallel regions (measured: 45 ms per SmolLM2 step, 673 ms beside one busy process).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors: argparse has printed them
        return e.code if isinstance(e.code, int) else 2
    return run_command(f"anyfp4 {args.command}", lambda: args.func(args), args.debug)
