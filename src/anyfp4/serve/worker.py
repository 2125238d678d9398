"""The generation worker: one thread owns the model and generates for one request at a time, in arrival order,
from a bounded queue (why one at a time: the package docstring).

A request is a ``Job`` made on the event loop; the worker sends its events back to that loop (``TextDelta``
as the text comes, then ``Finished`` or ``Failed``). ``Job.cancel`` (the client left) drops a queued job and
stops a running one at its next token. ``stop_accepting`` (a signal arrived) refuses new jobs and ends the
queued and the running ones with a 503, the running one at its next token; ``close`` then ends the thread.
Every use of the tokenizer, from the routes or the worker, holds one lock (fast tokenizers refuse to be
borrowed by two threads at once)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

import torch

from ..runtime.generate import SamplingParams, generate
from ..runtime.session import Session
from .text import ReplyText

LOG = logging.getLogger("anyfp4.serve")


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (a stop token or string) or "length" (max_tokens)
    text: str  # the whole reply
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    status: int
    message: str
    code: str


@dataclass(frozen=True)
class Cancelled:
    """The client left (put by ``Job.cancel`` itself, so that whoever waits for the job stops waiting)."""


SHUTTING_DOWN = Failed(503, "the server is shutting down", "shutting_down")


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class Job:
    """One request's generation. Made, read and cancelled on the event loop; fed by the worker thread."""

    def __init__(self, prompt: list[int], params: SamplingParams, stops: tuple[str, ...], incremental: bool):
        self.prompt, self.params, self.stops, self.incremental = prompt, params, stops, incremental
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.events.put_nowait(Cancelled())

    def push(self, event) -> None:
        """From the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass

    async def next_event(self):
        return await self.events.get()


class _StopString(Exception):
    pass


class _Ended(Exception):
    """The job was cancelled, or the server is stopping."""


class GenerationWorker:
    def __init__(self, session: Session, max_queue: int):
        self.session = session
        self.tokenizer_lock = threading.Lock()
        self.stopping = False
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._submit_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- the tokenizer, under its lock --------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return list(self.session.encode(text))

    def encode_chat(self, messages: list[dict]) -> list[int]:
        with self.tokenizer_lock:
            return self.session.encode_chat(messages)

    def _reply_text(self, tokens: list[int], params: SamplingParams) -> str:
        with self.tokenizer_lock:
            return self.session.reply_text(tokens, params)

    # -- the queue ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="anyfp4-generation", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; QueueFull when the queue is full, ShuttingDown once the server stops."""
        with self._submit_lock:
            if self.stopping or self._thread is None:
                raise ShuttingDown
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise QueueFull from None

    def waiting(self) -> int:
        """Jobs in the queue (not counting the one generating)."""
        return self._queue.qsize()

    def stop_accepting(self) -> None:
        """Safe in a signal handler: one assignment, no lock."""
        self.stopping = True

    def close(self, timeout: float | None = None) -> None:
        with self._submit_lock:
            self.stopping = True
        if self._thread is not None:
            self._queue.put(None)  # after every job: the thread ends jobs quickly once stopping
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        device = self.session.model.device
        if device.type == "cuda":  # this thread's current device: where its kernels launch, its graphs are captured
            torch.cuda.set_device(device)
        while (job := self._queue.get()) is not None:
            if job.cancelled:
                continue
            if self.stopping:
                job.push(SHUTTING_DOWN)
                continue
            try:
                self._generate(job)
            except Exception as error:  # a failed generation ends its request, not the server
                LOG.exception("generation failed")
                job.push(Failed(500, f"generation failed: {type(error).__name__}: {error}", "generation_failed"))

    def _generate(self, job: Job) -> None:
        session, params = self.session, job.params
        produced: list[int] = []
        text = ReplyText(lambda tokens: self._reply_text(tokens, params), job.stops, job.incremental)

        def on_tokens(step: list[int]) -> None:
            if job.cancelled or self.stopping:
                raise _Ended
            produced.append(step[0])
            delta, stopped = text.add(produced)
            if delta:
                job.push(TextDelta(delta))
            if stopped:
                raise _StopString

        try:
            generate(session.model, [job.prompt], params, on_tokens, compile_decode=session.compile_decode)
            reason = "stop" if produced and produced[-1] in params.stop_token_ids else "length"
        except _StopString:
            reason = "stop"
        except _Ended:
            if not job.cancelled:
                job.push(SHUTTING_DOWN)
            return
        rest = text.finish(produced)
        if rest:
            job.push(TextDelta(rest))
        job.push(Finished(reason, text.final, len(job.prompt), len(produced)))
