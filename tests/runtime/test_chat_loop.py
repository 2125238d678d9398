"""The chat loop: a reply stopped by Ctrl-C keeps the conversation going."""

import io

from anyfp4.runtime.generate import SamplingParams
from anyfp4.runtime.session import REPLY_STOPPED, chat_loop


class ScriptedSession:
    """Replies ``partial`` and is interrupted on the turns in ``interrupted``; records what it was asked."""

    def __init__(self, interrupted: dict[int, str]):
        self.interrupted, self.conversations = interrupted, []

    def encode_chat(self, messages):
        self.conversations.append([dict(m) for m in messages])
        return [1]

    def complete(self, prompts, params, stream=None, status=None):
        turn = len(self.conversations) - 1
        if turn in self.interrupted:
            stream.write(self.interrupted[turn])
            stream.write("\n")  # as Session.complete ends an interrupted reply
            raise KeyboardInterrupt
        stream.write(f"reply {turn}\n")
        return [f"reply {turn}"]


def test_an_interrupted_reply_stays_in_the_conversation():
    session = ScriptedSession({0: "half a rep"})
    out, err = io.StringIO(), io.StringIO()
    chat_loop(session, SamplingParams(), stdin=io.StringIO("first\nsecond\n\n"), stdout=out, stderr=err)
    assert session.conversations[1] == [{"role": "user", "content": "first"},
                                        {"role": "assistant", "content": "half a rep"},
                                        {"role": "user", "content": "second"}]
    assert err.getvalue() == REPLY_STOPPED + "\n"
    assert out.getvalue().count("> ") == 3


def test_a_reply_stopped_before_its_first_word_drops_the_turn():
    session = ScriptedSession({0: ""})
    chat_loop(session, SamplingParams(), system="be brief", stdin=io.StringIO("first\nsecond\n\n"),
              stdout=io.StringIO(), stderr=io.StringIO())
    assert session.conversations[1] == [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "second"}]
