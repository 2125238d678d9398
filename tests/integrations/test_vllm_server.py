"""vLLM's OpenAI-compatible server with anyfp4 checkpoints, as a user starts it on vLLM's CPU build
(``python -m vllm.entrypoints.openai.api_server --model CKPT --quantization anyfp4``, the engine in its own
process): NVFP4, FP8 and mixed ModelOpt exports, a compressed-tensors NVFP4 one and a Qwen3-MoE NVFP4 one. Through
the ``openai`` client: completions and chat completions (the checkpoint's chat template), streaming and not, eight
requests at once; the greedy texts are anyfp4's own runner's and the same sent alone or together; SIGTERM stops the
server cleanly. Run by `.ci/vllm`; skipped where vLLM or the client is not installed."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from helpers import (  # noqa: E402
    TINY_LLAMA,
    free_port,
    save_random_moe,
    to_compressed_tensors,
    write_runnable_checkpoint,
)

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint  # noqa: E402
from anyfp4.runtime.generate import SamplingParams  # noqa: E402
from anyfp4.runtime.session import Session  # noqa: E402

START_SECONDS = 420  # vLLM's import, engine process and profiling run on a busy 2-core machine
MAX_TOKENS = 12
PROMPTS = ["the cat sat", "hello there, friend", "a b c d", "numbers 1 2 3"]
# vLLM's CPU attention takes head sizes of 32 and up
CONFIG = dict(TINY_LLAMA, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
              intermediate_size=128)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-server")
    src = write_runnable_checkpoint(root / "src", CONFIG, stop_tokens=False)
    out = {fmt: Path(quantize_checkpoint(src, root / fmt, QuantizeOptions(format=TargetFormat(fmt),
                                                                          progress=False)).dst)
           for fmt in ("nvfp4", "fp8", "mixed")}
    out["ct-nvfp4"] = to_compressed_tensors(out["nvfp4"], root / "ct-nvfp4")
    moe = save_random_moe(root / "moe-src", "qwen3_moe", stop_tokens=False)
    out["moe-nvfp4"] = Path(quantize_checkpoint(moe, root / "moe-nvfp4", QuantizeOptions(
        format=TargetFormat.NVFP4, progress=False)).dst)
    return out


def runner_texts(ckpt: Path) -> dict:
    """anyfp4's own greedy texts for every prompt, raw and as a one-turn chat."""
    session = Session.load(ckpt, "cpu", "fp32", progress=False)
    params = SamplingParams(max_new_tokens=MAX_TOKENS)
    texts = {}
    for p in PROMPTS:
        texts[("completion", p)] = session.complete([session.encode(p)], params)[0]
        texts[("chat", p)] = session.complete([session.encode_chat([{"role": "user", "content": p}])], params)[0]
    return texts


class Server:
    """vLLM's OpenAI server on a loopback port, its output in a log file."""

    def __init__(self, ckpt: Path, log: Path):
        self.port, self.log = free_port(), log
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's default: the engine in its own process
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt),
                "--quantization", "anyfp4", "--served-model-name", "tiny", "--host", "127.0.0.1",
                "--port", str(self.port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128",
                "--max-num-seqs", "8", "--seed", "0", "--no-enable-prefix-caching",
                "--kv-cache-memory-bytes", str(64 * 1024**2)]
        self.process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0,
                                    timeout=120)

    def wait_healthy(self) -> None:
        import urllib.request

        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM's server exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        pytest.fail(f"vLLM's server was not healthy after {START_SECONDS} s:\n{self.tail()}")

    def tail(self) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-40:])

    def ask(self, kind: str, prompt: str, stream: bool) -> str:
        """One greedy request; the reply's text (a stream's deltas joined)."""
        common = dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0.0, stream=stream)
        if kind == "completion":
            reply = self.client.completions.create(prompt=prompt, **common)
            return "".join(c.choices[0].text for c in reply) if stream else reply.choices[0].text
        reply = self.client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        return reply.choices[0].message.content

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed", "ct-nvfp4", "moe-nvfp4"])
def test_openai_server_serves_the_runners_texts_alone_and_together(checkpoints, fmt, tmp_path):
    want = runner_texts(checkpoints[fmt])
    server = Server(checkpoints[fmt], tmp_path / "server.log")
    try:
        server.wait_healthy()
        requests = [(kind, p, i % 2 == 0) for i, (kind, p) in enumerate(want)]  # half of them streamed
        alone = [server.ask(*r) for r in requests]
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: server.ask(*r), requests))
    except BaseException as e:
        server.process.kill()
        server.process.wait()
        raise AssertionError(f"{type(e).__name__}: {e}\nvLLM's server log ends:\n{server.tail()}") from e
    code = server.stop()
    assert code == 0, f"vLLM's server exited with {code} on SIGTERM:\n{server.tail()}"
    for (kind, p, stream), a, t in zip(requests, alone, together):
        assert a == want[(kind, p)], (kind, p, stream, a, want[(kind, p)])
        assert t == a, (kind, p, stream, t, a)
    assert any(want.values()), "every reply is empty: the comparison would prove nothing"
