"""A reply's text as its tokens come, in time proportional to the new tokens: what
``tokenizer.decode(tokens, skip_special_tokens=True)`` gives for the tokens so far (stop tokens left out), without
decoding them all again at every token (SmolLM2's tokenizer decodes 256 tokens in ~105 us on a 2-core CPU: 16
streams half-way through 512 tokens re-decoded ~1.7 ms a step, a third of a batched decode step on an H200).

The fast tokenizers' own ``tokenizers.decoders.DecodeStream`` decodes each new token against the ones before it
(a character split over tokens, a leading space the decoder strips at the start of a text), so the pieces add up
to the whole decode. transformers may then clean up the spaces before punctuation (``clean_up_tokenization_spaces``;
whether it does depends on its version and the tokenizer's model): whether it does is asked of ``decode`` itself
on a probe, and where it does, ``clean_up_tokenization`` is applied to the whole text, as ``decode`` applies it.
A tokenizer without a ``backend_tokenizer`` is decoded whole each time."""

from __future__ import annotations

# what transformers' ``clean_up_tokenization`` replaces: a text ending in a prefix of one of these (" ", " n'")
# can still change when the next token comes
CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
CLEANUP_PROBE = "a . b"
INCOMPLETE = "\ufffd"  # a character whose remaining bytes are still to come (a whole decode's placeholder)


def whole_text(tokenizer, tokens: list[int], skip_ids) -> str:
    """The reply's text decoded whole: ``skip_ids`` (stop tokens) dropped, special tokens skipped."""
    return tokenizer.decode([t for t in tokens if t not in skip_ids], skip_special_tokens=True)


def cleans_up(tokenizer, backend) -> bool:
    """Whether ``tokenizer.decode`` changes the backend's text of a probe the clean-up would change."""
    ids = backend.encode(CLEANUP_PROBE, add_special_tokens=False).ids
    return tokenizer.decode(ids, skip_special_tokens=True) != backend.decode(ids, skip_special_tokens=True)


def settled_length(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` the next tokens cannot change or cut: all but a trailing partial character and a tail
    that could begin one of ``stops`` (stop strings, or what the decoder's clean-up would rewrite)."""
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


class ReplyDecoder:
    """``text(tokens)`` for a token list that only grows between calls; ``hold_back``: strings whose start, at
    the end of the text, the next token could still rewrite (held back from a stream like a stop string's start)."""

    def __init__(self, tokenizer, skip_ids):
        self.tokenizer, self.skip_ids = tokenizer, frozenset(skip_ids)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream, self.cleanup = None, False
        if self._backend is not None:
            try:
                from tokenizers.decoders import DecodeStream
            except ImportError:  # tokenizers before DecodeStream: decoded whole
                self._backend = None
            else:
                self._stream = DecodeStream(skip_special_tokens=True)
                self.cleanup = cleans_up(tokenizer, self._backend)
        self.hold_back = CLEANUP_PATTERNS if self.cleanup else ()
        self._fed = 0  # tokens of the list handed to the stream so far
        self._raw = ""  # the stream's text so far (before the clean-up)

    def text(self, tokens: list[int]) -> str:
        if self._backend is None:
            return whole_text(self.tokenizer, tokens, self.skip_ids)
        if len(tokens) < self._fed:
            raise ValueError("ReplyDecoder.text: the token list only grows between calls")
        for token in tokens[self._fed:]:  # one id a step: older tokenizers' DecodeStream takes no lists
            if token not in self.skip_ids:
                piece = self._stream.step(self._backend, token)
                if piece:
                    self._raw += piece
        self._fed = len(tokens)
        return self.tokenizer.clean_up_tokenization(self._raw) if self.cleanup else self._raw
