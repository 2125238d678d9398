"""A live "N tokens, X tok/s" note on a terminal while tokens stream; erased when generation ends.

Shown only when the note's stream (stderr) is a terminal, so pipes, files and tests get nothing. When the
text streams to the same terminal, the note sits just after the text: the cursor is saved before it and
restored after it, and the note is erased before more text is written. It is left out when the line is
too full to hold it, so it never wraps (a wrapped note would leave the restored cursor on the wrong row).
"""

from __future__ import annotations

import shutil
import time
from typing import TextIO

SAVE_CURSOR, RESTORE_CURSOR, ERASE_TO_END_OF_LINE = "\x1b7", "\x1b8", "\x1b[K"
MARGIN = 8  # columns kept free after the note: tabs and wide characters are counted approximately
MIN_SECONDS = 0.2  # no rate before this much decoding: the first steps' rate says little


class RateLine:
    def __init__(self, status: TextIO | None, text: TextIO | None = None):
        self.status = status if status is not None and status.isatty() else None
        self.shares_screen = self.status is not None and text is not None and text.isatty()
        self.column = 0  # where the streamed text has left the cursor, when it shares the screen
        self.tokens = 0
        self.first_token_time: float | None = None
        self.drawn = False

    def before_text(self) -> None:
        """Call before writing streamed text: the note makes room for it."""
        self.erase()

    def after_text(self, text: str) -> None:
        """Call after writing ``text`` to the shared screen: it moves the cursor."""
        if self.shares_screen:
            from rich.cells import cell_len

            line = text.rsplit("\n", 1)
            self.column = cell_len(line[-1]) + (self.column if len(line) == 1 else 0)

    def add(self, tokens: int) -> None:
        """``tokens`` more were produced: redraw the note."""
        if self.status is None:
            return
        now = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = now  # the rate is the decode rate: timed from the first token on
        self.tokens += tokens
        self.erase()
        elapsed = now - self.first_token_time
        if elapsed <= 0 or elapsed < MIN_SECONDS:
            return
        rate = (self.tokens - 1) / elapsed
        note = f"  {self.tokens} tokens, {rate:.1f} tok/s"
        width = shutil.get_terminal_size().columns
        column = self.column % width if self.shares_screen else 0
        if column + len(note) + MARGIN >= width:
            return
        self.drawn = True  # before writing: an interrupt during the write still gets the note erased
        self.status.write(SAVE_CURSOR + note + RESTORE_CURSOR)
        self.status.flush()

    def erase(self) -> None:
        if self.drawn:
            self.status.write(ERASE_TO_END_OF_LINE)
            self.status.flush()
            self.drawn = False
