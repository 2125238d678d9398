"""A reply's text as its tokens come: deltas that add up to the whole, held back where the next token could
still change them (a split character, the start of a stop string), cut before a stop string."""

import pytest

from anyfp4.runtime.reply_decode import settled_length
from anyfp4.serve.text import ReplyText, stop_index


def pieces_decoder(pieces: list[str]):
    """A decoder of token ids 0..n-1 into ``pieces``; ``"\ufffd"`` pieces stand for a partial character
    that the next piece completes (the pair decodes to ``"é"``)."""

    def decode(tokens):
        text = "".join(pieces[t] for t in tokens)
        return text.replace("\ufffd~", "é")

    return decode


def run(pieces: list[str], stops: tuple[str, ...], incremental: bool = True):
    reply = ReplyText(pieces_decoder(pieces), stops, incremental)
    sent, tokens = [], []
    for t in range(len(pieces)):
        tokens.append(t)
        delta, stopped = reply.add(tokens)
        sent.append(delta)
        if stopped:
            break
    sent.append(reply.finish(tokens))
    return sent, reply.final


def test_deltas_add_up_to_the_whole_text():
    sent, final = run(["Hel", "lo", " wor", "ld"], ())
    assert sent == ["Hel", "lo", " wor", "ld", ""] and final == "Hello world"


def test_a_split_character_waits_for_its_end():
    sent, final = run(["caf", "\ufffd", "~", "!"], ())
    assert sent == ["caf", "", "é", "!", ""] and final == "café!"


def test_the_start_of_a_stop_string_is_held_back_and_a_stop_string_cuts_the_reply():
    sent, final = run(["one ", "two", " ST", "O", "P three"], ("STOP",))
    assert sent == ["one ", "two", " ", "", "", ""] and final == "one two "


def test_a_held_back_tail_that_is_no_stop_is_sent_later():
    sent, final = run(["a S", "T", "x"], ("STOP",))
    assert sent == ["a ", "", "STx", ""] and final == "a STx"


def test_the_first_of_several_stop_strings_wins():
    assert stop_index("abcdef", ("de", "bc")) == 1
    assert stop_index("abc", ("x",)) is None


@pytest.mark.parametrize("text, stops, settled", [
    ("abc", (), 3), ("abc\ufffd", (), 3), ("ab\ufffd\ufffd", ("x",), 2),
    ("hello ST", ("STOP",), 6), ("hello S", ("STOP", "So"), 6), ("hello", ("STOP",), 5),
])
def test_settled_length(text, stops, settled):
    assert settled_length(text, stops) == settled


def test_without_incremental_text_all_comes_at_the_end():
    sent, final = run(["Hel", "lo", " STOP", "x"], ("STOP",), incremental=False)
    assert sent == ["", "", "", "", "Hello "] and final == "Hello "


def test_the_final_text_is_the_whole_decode_a_cut_character_included():
    """The token-by-token text leaves out a character still to be completed; a reply that ends there ends as the
    whole decode shows it (what ``anyfp4 generate`` prints)."""
    pieces = ["caf", "\ufffd"]
    whole = pieces_decoder(pieces)
    reply = ReplyText(lambda tokens: whole(tokens).rstrip("\ufffd"), (), True, decode_whole=whole)
    assert [reply.add([0])[0], reply.add([0, 1])[0], reply.finish([0, 1])] == ["caf", "", "\ufffd"]
    assert reply.final == "caf\ufffd"
