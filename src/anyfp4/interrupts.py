"""SIGINT and SIGTERM as an exception, so that ``except`` / ``finally`` blocks clean up before the process ends.

Python already turns SIGINT into ``KeyboardInterrupt``; SIGTERM would end the process without running any
cleanup. Inside ``signals_raise()`` both raise ``Interrupted``, which carries the signal so that a command
line can exit with the shell's ``128 + signal`` status. ``signals_held()`` defers both across a few system
calls that must not be separated (two renames).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

CAUGHT = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The process got SIGINT or SIGTERM. A BaseException, as KeyboardInterrupt is: ``except Exception``
    does not swallow it. ``outcome`` says what the interrupted work left behind, where it knows."""

    def __init__(self, signum: int, outcome: str = ""):
        self.signum = signum
        self.outcome = outcome
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _raise(signum, frame):
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def handlers(signums, handler) -> Iterator[None]:
    """``handler`` for each of ``signums`` while the block runs (main thread only, where Python can set them),
    the previous handlers back afterwards. A signal the process was told to ignore (SIG_IGN, e.g. SIGINT under
    ``nohup``) stays ignored."""
    if not _in_main_thread():
        yield
        return
    previous = {}
    for signum in signums:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        # no signal may land between two restores (its handler would raise and skip the rest); a handler that
        # was installed from C reads back as None and is restored as the default
        with signals_held(tuple(previous)):
            for signum, old in previous.items():
                signal.signal(signum, signal.SIG_DFL if old is None else old)


def signals_raise():
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread while the block runs."""
    return handlers(CAUGHT, _raise)


@contextmanager
def signals_held(signums=CAUGHT) -> Iterator[None]:
    """``signums`` (SIGINT and SIGTERM) wait until the block has run; they are then delivered (and raise) as
    usual. Keep the block to a few system calls: the user cannot interrupt it."""
    if not _in_main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
