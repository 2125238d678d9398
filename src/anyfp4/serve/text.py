"""A reply's text as its tokens come: the part safe to send now, and where a stop string ends it.

The text is always the decode of all tokens so far (as ``anyfp4 generate`` decodes them), never a sum of
per-token pieces: a character split over tokens, or a tokenizer that joins pieces, comes out as it would at
the end. Held back until the next token: a trailing U+FFFD (a character whose remaining bytes are still to
come) and a tail that could be the start of a stop string (OpenAI's replies leave the stop string out)."""

from __future__ import annotations

from typing import Callable

INCOMPLETE = "\ufffd"


def stop_index(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the first stop string in ``text`` begins; None when there is none."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def settled_length(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` the next tokens cannot change or cut."""
    end = len(text)
    while end and text[end - 1] == INCOMPLETE:
        end -= 1
    settled = end
    for stop in stops:
        for k in range(min(len(stop) - 1, end), 0, -1):
            if text.startswith(stop[:k], end - k):
                settled = min(settled, end - k)
                break
    return settled


class ReplyText:
    """``decode(tokens)`` -> text; ``add`` after each token (only when the text is wanted as it comes:
    streaming, or stop strings to watch for), ``finish`` at the end."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...], incremental: bool):
        self.decode, self.stops, self.incremental = decode, stops, incremental
        self.sent = ""  # what add() and finish() have handed out, in order
        self.final: str | None = None  # the whole reply, once known

    def _take(self, upto: str) -> str:
        delta = upto[len(self.sent):]
        self.sent += delta
        return delta

    def add(self, tokens: list[int]) -> tuple[str, bool]:
        """(new text safe to send, whether a stop string ended the reply)."""
        if not self.incremental:
            return "", False
        text = self.decode(tokens)
        cut = stop_index(text, self.stops)
        if cut is not None:
            self.final = text[:cut]
            return self._take(self.final), True
        return self._take(text[:settled_length(text, self.stops)]), False

    def finish(self, tokens: list[int]) -> str:
        """The rest of the reply (all of it when nothing was sent as it came); ``final`` is the whole."""
        if self.final is None:
            text = self.decode(tokens)
            cut = stop_index(text, self.stops)
            self.final = text if cut is None else text[:cut]
        return self._take(self.final)
