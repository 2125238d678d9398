"""Host time a generation step spends on its streamed replies' text: ``--streams`` replies as ``anyfp4 serve``'s
worker streams them (a ``ReplyText`` each, its deltas pushed to the job's event loop) taking one token each per
step, for ``--tokens`` steps, with the text made token by token (``runtime.reply_decode.ReplyDecoder``) and with
the whole reply decoded again at every token (what the worker did before), timed in the same run. Tokens are a
real text's, so the replies are words.

    PYTHONPATH=src python benchmarks/probes/reply_text_cost.py --tokenizer DIR --out reply_text_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path

from anyfp4.runtime.generate import SamplingParams
from anyfp4.runtime.reply_decode import ReplyDecoder
from anyfp4.runtime.session import load_tokenizer
from anyfp4.serve.text import ReplyText
from anyfp4.serve.worker import Job, TextDelta

TEXT = Path(__file__).resolve().parents[2] / "README.md"


def step_ms(tokenizer, ids: list[int], streams: int, tokens: int, whole: bool) -> float:
    """Mean host milliseconds a step: every stream's next token through its row."""
    lock = threading.Lock()

    async def run() -> float:
        params = SamplingParams(max_new_tokens=tokens)
        replies = []
        for _ in range(streams):
            job = Job([0], params, (), True)
            decoder = ReplyDecoder(tokenizer, ())
            if whole:
                def text(produced, lock=lock):
                    with lock:
                        return tokenizer.decode(produced, skip_special_tokens=True)
            else:
                def text(produced, decoder=decoder, lock=lock):
                    with lock:
                        return decoder.text(produced)
            replies.append((job, ReplyText(text, (), True, decoder.hold_back), []))

        def work() -> float:
            start = time.perf_counter()
            for step in range(tokens):
                for r, (job, reply, produced) in enumerate(replies):
                    produced.append(ids[(step * streams + r) % len(ids)])
                    delta, _ = reply.add(produced)
                    if delta:
                        job.push(TextDelta(delta))
            return time.perf_counter() - start

        return await asyncio.get_running_loop().run_in_executor(None, work)  # the worker's own thread, as served

    return asyncio.run(run()) / tokens * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer directory")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    ids = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    result = {"tokenizer": str(args.tokenizer), "streams": args.streams, "tokens": args.tokens,
              "token_by_token_ms_per_step": step_ms(tokenizer, ids, args.streams, args.tokens, whole=False),
              "whole_reply_ms_per_step": step_ms(tokenizer, ids, args.streams, args.tokens, whole=True),
              "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
