import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from anyfp4.runtime.generate import SamplingParams  # noqa: E402
from anyfp4.runtime.session import Session  # noqa: E402
from helpers import write_runnable_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny runnable checkpoint with no stop token: every reply runs to its max_tokens."""
    return write_runnable_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", stop_tokens=False)


@pytest.fixture(scope="session")
def session(checkpoint):
    return Session.load(checkpoint, "cpu", "fp32", progress=False)


class Runner:
    """The runner's own greedy texts (``Session.complete``, as ``anyfp4 generate`` prints them), for a raw
    prompt or a one-turn chat. Only while no server's worker runs: the model serves one caller at a time."""

    def __init__(self, session: Session):
        self.session = session

    def text(self, prompt: str, max_tokens: int, chat: bool = False, **sampling) -> str:
        s = self.session
        ids = s.encode_chat([{"role": "user", "content": prompt}]) if chat else s.encode(prompt)
        return s.complete([ids], SamplingParams(max_new_tokens=max_tokens, **sampling))[0]


@pytest.fixture(scope="session")
def runner(session):
    return Runner(session)
