"""A reply's text as its tokens come: the part safe to send now, and where a stop string ends it.

The text is always the decode of all tokens so far, as ``anyfp4 generate`` decodes them (made token by token by
``runtime.reply_decode.ReplyDecoder``, whose text is the whole decode's): a character split over tokens, or a
tokenizer that joins pieces, comes out as it would at the end. Held back until the next token
(``settled_length``): a trailing U+FFFD (a character whose remaining bytes are still to come), a tail that could
be the start of a stop string (OpenAI's replies leave the stop string out) or that the tokenizer's clean-up
could still rewrite."""

from __future__ import annotations

from typing import Callable

from ..runtime.reply_decode import settled_length


def stop_index(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the first stop string in ``text`` begins; None when there is none."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class ReplyText:
    """``decode(tokens)`` -> text (of a token list that only grows); ``add`` after each token (only when the text
    is wanted as it comes: streaming, or stop strings to watch for), ``finish`` at the end, with ``decode_whole``
    (default ``decode``): the whole decode, a character cut off at the end included as ``decode`` shows it.
    ``hold_back``: strings whose start at the end of the text the decoder could still rewrite
    (``ReplyDecoder.hold_back``)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...], incremental: bool,
                 hold_back: tuple[str, ...] = (), decode_whole: Callable[[list[int]], str] | None = None):
        self.decode, self.stops, self.incremental, self.hold_back = decode, stops, incremental, hold_back
        self.decode_whole = decode_whole or decode
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
        return self._take(text[:settled_length(text, self.stops + self.hold_back)]), False

    def finish(self, tokens: list[int]) -> str:
        """The rest of the reply (all of it when nothing was sent as it came); ``final`` is the whole."""
        if self.final is None:
            text = self.decode_whole(tokens)
            cut = stop_index(text, self.stops)
            self.final = text if cut is None else text[:cut]
        return self._take(self.final)
