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
from typing import Callable, Iterator

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


def _run_all(steps: list[Callable[[], object]]) -> None:
    """Run every step, also after one raised; the last exception propagates (the earlier ones as its context)."""
    if steps:
        try:
            steps[0]()
        finally:
            _run_all(steps[1:])


def _restore(previous: dict) -> None:
    """Set each signal's handler back to ``previous``'s (a handler that was installed from C reads back as None
    and is restored as the default). ``signal.signal`` first runs the handler of a signal that has just come and
    sets nothing when that handler raises: the setting is tried again, so that every handler is back before the
    first such exception propagates. (signal.signal's own errors cannot happen here: each handler was read from
    it in this, the main, thread.)"""
    raised = None
    for signum, old in previous.items():
        while True:
            try:
                signal.signal(signum, signal.SIG_DFL if old is None else old)
                break
            except BaseException as e:
                raised = raised or e
    if raised is not None:
        raise raised


@contextmanager
def handlers(signums, handler) -> Iterator[None]:
    """``handler`` for each of ``signums`` while the block runs (main thread only, where Python can set them),
    the previous handlers back afterwards. A signal the process was told to ignore (SIG_IGN, e.g. SIGINT under
    ``nohup``) stays ignored."""
    if not _in_main_thread():
        yield
        return
    previous = {}
    try:
        for signum in signums:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        _restore(previous)


def signals_raise():
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread while the block runs."""
    return handlers(CAUGHT, _raise)


@contextmanager
def signals_held(signums=CAUGHT) -> Iterator[None]:
    """``signums`` (SIGINT and SIGTERM) wait until the block has run; they are then delivered (and raise) as
    usual. Keep the block to a few system calls: the user cannot interrupt it.

    Blocking the signals (``pthread_sigmask``) holds them for this thread only. A process with other threads
    (torch's OpenMP workers, say) gets a signal sent to the process, or a Ctrl-C, in one of those, and Python
    then runs the handler here at the next bytecode, inside the block. So while the block runs, each Python
    handler (and the default action) is also replaced by one that only notes the signal; once the handlers are
    back, the noted signals are raised again in this thread. A handler installed from C is only blocked."""
    if not _in_main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    noted: list[int] = []

    def note(signum, frame):
        noted.append(signum)

    def raise_noted():
        _run_all([lambda s=s: signal.raise_signal(s) for s in dict.fromkeys(noted)])

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask as it is: changes nothing
    previous = {}
    try:
        for signum in signums:  # a signal that came before the block raises here, before it is replaced
            if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                previous[signum] = signal.signal(signum, note)
        signal.pthread_sigmask(signal.SIG_BLOCK, signums)
        yield
    finally:
        # the handlers first: what the mask held for this thread is then delivered to them; what was noted
        # (every note is in once no handler notes any more) is raised last
        _run_all([lambda: _restore(previous), lambda: signal.pthread_sigmask(signal.SIG_SETMASK, before),
                  raise_noted])
