"""The live tok/s note: only on a terminal, beside the streamed text without wrapping, erased at the end."""

import io

import pytest

from anyfp4.runtime import rate_line
from anyfp4.runtime.rate_line import ERASE_TO_END_OF_LINE as ERASE
from anyfp4.runtime.rate_line import RESTORE_CURSOR as RESTORE
from anyfp4.runtime.rate_line import SAVE_CURSOR as SAVE
from anyfp4.runtime.rate_line import RateLine


class Tty(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(rate_line, "time", clock)
    monkeypatch.setenv("COLUMNS", "80")
    return clock


def test_nothing_when_stderr_is_not_a_terminal(clock):
    status = io.StringIO()
    line = RateLine(status, io.StringIO())
    for _ in range(5):
        clock.now += 1
        line.add(1)
    line.erase()
    assert status.getvalue() == ""


def test_the_note_counts_tokens_and_their_rate_and_is_erased(clock):
    status = Tty()
    line = RateLine(status)
    line.add(1)  # the first token starts the clock: the rate is the decode rate
    clock.now += 0.1
    line.add(1)
    assert status.getvalue() == ""  # too early to say
    clock.now += 0.4
    line.add(2)
    assert status.getvalue() == SAVE + "  4 tokens, 6.0 tok/s" + RESTORE
    line.erase()
    assert status.getvalue().endswith(RESTORE + ERASE)


def test_beside_text_on_the_same_terminal_and_left_out_when_the_line_is_full(clock):
    status, text = Tty(), Tty()
    line = RateLine(status, text)
    line.add(1)
    clock.now += 1
    line.before_text()
    line.after_text("x" * 40)
    line.add(1)
    assert status.getvalue().endswith(RESTORE)  # 40 + note + margin fits in 80 columns
    line.before_text()
    assert status.getvalue().endswith(ERASE)  # erased before more text is written
    line.after_text("y" * 20)  # 60 columns used: the note would wrap
    drawn = status.getvalue()
    line.add(1)
    assert status.getvalue() == drawn
    line.after_text("z\nshort")  # a new line: room again
    line.add(1)
    assert status.getvalue().endswith("  4 tokens, 3.0 tok/s" + RESTORE)


def test_session_shows_the_note_while_streaming(tmp_path, monkeypatch):
    from anyfp4.runtime.generate import SamplingParams
    from anyfp4.runtime.session import Session
    from helpers import write_runnable_checkpoint

    monkeypatch.setattr(rate_line, "MIN_SECONDS", 0.0)
    session = Session.load(write_runnable_checkpoint(tmp_path / "m"), "cpu", "fp32", progress=False)
    out, status = io.StringIO(), Tty()
    session.complete([session.encode("hello")], SamplingParams(max_new_tokens=6, stop_token_ids=(999,)),
                     stream=out, status=status)
    assert "tok/s" in status.getvalue() and status.getvalue().endswith(ERASE)
    assert out.getvalue().endswith("\n") and "tok/s" not in out.getvalue()
