"""Ctrl-C and SIGTERM sent to a running ``python -m anyfp4``: one line, exit code 130 / 143; ``chat``
survives a Ctrl-C during a reply."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from anyfp4.runtime.session import REPLY_STOPPED
from helpers import TINY_LLAMA, write_runnable_checkpoint

SRC = str(Path(__file__).resolve().parents[2] / "src")
# a long context, no stop token: a generation runs until it is stopped
ENDLESS = dict(TINY_LLAMA, max_position_embeddings=8192)


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    return write_runnable_checkpoint(tmp_path_factory.mktemp("signals") / "m", ENDLESS, stop_tokens=False)


class Running:
    """``python -m anyfp4 ARGS`` in its own session, its stdout and stderr collected as they come."""

    def __init__(self, *args: str, **env_vars: str):
        env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", **env_vars)
        self.process = subprocess.Popen([sys.executable, "-m", "anyfp4", *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                        start_new_session=True)
        self.out, self.err = bytearray(), bytearray()
        self.readers = [threading.Thread(target=self._collect, args=(s, b), daemon=True)
                        for s, b in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _collect(stream, into: bytearray) -> None:
        while chunk := stream.read1(4096):
            into.extend(chunk)

    def wait_for(self, condition, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, f"exited early: {bytes(self.err).decode()}"
            assert time.monotonic() < deadline, f"timed out; stderr: {bytes(self.err).decode()}"
            time.sleep(0.05)

    def send(self, text: str) -> None:
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return code


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "anyfp4 generate: interrupted"),
                                                 (signal.SIGTERM, 143, "anyfp4 generate: terminated")])
def test_generate_stopped_by_a_signal(endless, signum, code, line):
    run = Running("generate", str(endless), "--prompt", "hello", "--max-tokens", "8000", "--device", "cpu",
                  "--quiet")
    run.wait_for(lambda: len(run.out) >= 8)  # tokens are streaming
    run.process.send_signal(signum)
    assert run.finish() == code
    assert run.err.decode() == line + "\n"
    assert run.out.endswith(b"\n")  # the interrupted text ends its line


def test_chat_survives_ctrl_c_during_a_reply(endless):
    run = Running("chat", str(endless), "--max-tokens", "8000", "--device", "cpu", "--quiet")
    run.wait_for(lambda: run.out.endswith(b"> "))
    run.send("hello\n")
    prompt_end = len(run.out)
    run.wait_for(lambda: len(run.out) > prompt_end + 8)  # the reply is streaming
    run.process.send_signal(signal.SIGINT)
    run.wait_for(lambda: REPLY_STOPPED.encode() in run.err and run.out.endswith(b"> "))
    run.send("\n")  # an empty line ends the chat
    assert run.finish() == 0
    assert run.err.decode() == REPLY_STOPPED + "\n"


def test_chat_ctrl_c_at_the_prompt_ends_it(endless):
    run = Running("chat", str(endless), "--device", "cpu", "--quiet")
    run.wait_for(lambda: run.out.endswith(b"> "))
    run.process.send_signal(signal.SIGINT)
    assert run.finish() == 130
    assert run.err.decode() == "anyfp4 chat: interrupted\n" and run.out.endswith(b"> \n")


@pytest.mark.slow
def test_tensor_parallel_ranks_stop_with_the_command(endless):
    """Ctrl-C reaches the whole process group: the ranks leave it to the command, which stops them."""
    with socket.socket() as s:  # a free rendezvous port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = Running("generate", str(endless), "--prompt", "hello", "--max-tokens", "8000", "--device", "cpu",
                  "--quiet", "--tp", "2", MASTER_PORT=str(port))
    time.sleep(1)
    run.wait_for(lambda: len(_children(run.process.pid)) >= 2)
    ranks = _children(run.process.pid)
    time.sleep(3)  # the ranks are loading or generating
    os.killpg(run.process.pid, signal.SIGINT)
    assert run.finish() == 130
    err = run.err.decode()  # the ranks' communication library may warn about the host on its own
    assert err.endswith("\nanyfp4 generate: interrupted\n") or err == "anyfp4 generate: interrupted\n"
    assert "Traceback" not in err and "leaked" not in err
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has ended; only its parent's bookkeeping is left


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    found = []
    for task in tasks.iterdir() if tasks.exists() else []:
        children = task / "children"
        if children.exists():
            found += [int(c) for c in children.read_text().split()]
    return found


def test_a_reader_leaving_the_pipe_ends_generate_quietly(endless):
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    process = subprocess.Popen([sys.executable, "-m", "anyfp4", "generate", str(endless), "--prompt", "hello",
                                "--max-tokens", "8000", "--device", "cpu", "--quiet"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    process.stdout.read(20)
    process.stdout.close()  # as `| head -c 20` does
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""
