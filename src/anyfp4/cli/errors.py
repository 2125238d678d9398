"""How the ``anyfp4`` command ends: exit codes, one-line error messages, Ctrl-C and SIGTERM.

    0    success
    1    the command ran but its result is negative (inspect: invalid checkpoint), or it failed at run
         time (out of memory, a failed tensor-parallel rank, a missing optional package)
    2    usage error, bad input (an option, a prompt, a configuration) or an unreadable checkpoint
    130  interrupted (SIGINT, Ctrl-C)
    143  terminated (SIGTERM)

Every error is one line on stderr, ``anyfp4 COMMAND: error: MESSAGE``; ``--debug`` or ``ANYFP4_DEBUG=1``
prints the traceback before it. Exceptions of other types are bugs and keep Python's traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

EXIT_NEGATIVE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_BROKEN_PIPE = 128 + 13  # as if killed by SIGPIPE, which Python ignores (the constant is POSIX only)


class InputError(ValueError):
    """Bad input found by the command line itself: an option, a prompt, a combination of options."""


class Terminated(BaseException):
    """SIGTERM arrived. Raised in the main thread by the handler ``run_command`` installs, so that
    finally-blocks and cleanup (a partial checkpoint removed, ranks stopped) run as after Ctrl-C; a
    BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it."""


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated


def _sigterm_raises():
    from ..interrupts import handlers

    return handlers((signal.SIGTERM,), _raise_terminated)


def exit_code(error: BaseException) -> int | None:
    """The exit code of an error reported in one line; None for a bug (its traceback is kept)."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, Terminated):
        return EXIT_TERMINATED
    if isinstance(error, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    # CheckpointError, UnsupportedModelError, InputError and the library's validation are ValueErrors
    if isinstance(error, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)):
        return EXIT_USAGE
    if isinstance(error, (MemoryError, OSError, ImportError, RuntimeError)):
        return EXIT_NEGATIVE
    return None


def one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.strerror}: {error.filename}"
    else:
        text = str(error) or type(error).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def run_command(command: str, run, debug: bool = False) -> int:
    """``run()``'s exit code, or the documented code of the error it raised, reported in one line on stderr
    (``command`` is e.g. ``anyfp4 generate``). SIGTERM raises ``Terminated`` while it runs."""
    from ..env import debug_tracebacks

    try:
        with _sigterm_raises():
            return run()
    except BaseException as error:
        code = exit_code(error)
        if code is None:
            raise
        if code == EXIT_BROKEN_PIPE:  # the reader left (`| head`): nothing more to say to anyone
            _silence_stdout()
            return code
        debug = debug or debug_tracebacks()
        if debug:
            traceback.print_exception(error)
        # Frames of the failed call go first: progress bars they held close now and print their last line
        # before the message, not after it.
        traceback.clear_frames(error.__traceback__)
        if code == EXIT_INTERRUPTED:
            message = f"{command}: interrupted"
        elif code == EXIT_TERMINATED:
            message = f"{command}: terminated"
        else:
            hint = " (--debug shows where)" if isinstance(error, RuntimeError) and not debug else ""
            message = f"{command}: error: {one_line(error)}{hint}"
        try:
            sys.stdout.flush()  # what the command printed comes before the message
        except OSError:
            pass
        print(message, file=sys.stderr, flush=True)
        return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (e.g. captured by a test)
        pass
