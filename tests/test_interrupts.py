"""``signals_held``: SIGINT and SIGTERM sent to the process wait until the block has run, also where another
thread (torch's OpenMP workers in the command) takes the signal while this one has it blocked.

Each case runs in a forked child (one thread, plus the helper thread where asked), which sends the signal
to its own process as a Ctrl-C or ``kill`` does and reports what happened through a pipe.
"""

import os
import signal
import threading
import time

import pytest

from anyfp4.interrupts import CAUGHT, Interrupted, signals_held, signals_raise


def _until_taken(signum: int) -> None:
    """Until a thread has taken ``signum`` (where one can: here it stays pending), then a little longer, for
    Python to run the handler at the next bytecodes of this thread if it were going to."""
    deadline = time.monotonic() + 0.5
    while signum in signal.sigpending() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.02)


def _in_child(scenario, helper_thread: bool) -> tuple[int, list[str]]:
    """``scenario(step)`` in a forked child; returns its exit status and the steps it passed to ``step``
    (each sent at once, so that those before the child ended come back)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        os.close(read)

        def step(text: str) -> None:
            os.write(write, (text + "\n").encode())

        try:
            if helper_thread:  # a thread that does not block the signals: the kernel gives them to it
                threading.Thread(target=threading.Event().wait, daemon=True).start()
            scenario(step)
        except BaseException as e:
            step(f"{type(e).__name__} {e}")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        steps = pipe.read().splitlines()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), steps


@pytest.mark.parametrize("helper_thread", [False, True], ids=["one-thread", "another-thread"])
def test_an_interrupt_waits_for_the_held_block(helper_thread):
    def scenario(step):
        before = [signal.getsignal(s) for s in CAUGHT]
        with signals_raise():
            raising = [signal.getsignal(s) for s in CAUGHT]
            try:
                with signals_held():
                    os.kill(os.getpid(), signal.SIGINT)
                    _until_taken(signal.SIGINT)
                    step("held block done")
            except Interrupted as e:
                step(f"interrupted by {e}")
            step(f"raising handlers back: {[signal.getsignal(s) for s in CAUGHT] == raising}")
        step(f"handlers from before back: {[signal.getsignal(s) for s in CAUGHT] == before}")

    assert _in_child(scenario, helper_thread) == (0, ["held block done", "interrupted by SIGINT",
                                                      "raising handlers back: True", "handlers from before back: True"])


@pytest.mark.parametrize("helper_thread", [False, True], ids=["one-thread", "another-thread"])
def test_a_default_sigterm_ends_the_process_after_the_held_block(helper_thread):
    def scenario(step):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            _until_taken(signal.SIGTERM)
            step("held block done")
        step("not ended")

    assert _in_child(scenario, helper_thread) == (-signal.SIGTERM, ["held block done"])

