"""The generation worker: one thread owns the model and generates, in arrival order, from a bounded queue, for
one request at a time or, with ``max_batch`` > 1, for up to that many greedy requests at once (why one at a time
is the default: the package docstring).

A request is a ``Job`` made on the event loop; the worker sends its events back to that loop (``TextDelta``
as the text comes, then ``Finished`` or ``Failed``). ``Job.cancel`` (the client left) drops a queued job and
stops a running one at its next token (the others of its batch go on). ``stop_accepting`` (a signal arrived)
refuses new jobs and ends the queued and the running ones with a 503, the running ones at their next token;
``close`` then ends the thread. Every use of the tokenizer, from the routes or the worker, holds one lock (fast
tokenizers refuse to be borrowed by two threads at once).

Batches: when a greedy job is taken and ``max_batch`` > 1, the worker waits for more while they keep coming
(clients that start together reach the queue milliseconds apart: up to ``GATHER_QUIET_SECONDS`` between two,
``GATHER_MAX_SECONDS`` in all; with one fixed wait of 20 ms, 16 clients on an H200 got 750-1860 tok/s in all
over three runs, with 250 ms 2910), then takes every queued job that can share the generation — greedy, the
same stop tokens, and the batch's longest prompt plus its largest ``max_tokens`` within the context — up to
``max_batch``, in arrival order; the others keep their places. The batch runs as one left-padded generation
(the runner's batched decode) to its largest ``max_tokens``; each job ends at its own limit, stop token, stop
string or cancel. Sampled jobs run alone (a batch would share one random stream)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

import torch

from ..runtime.generate import SamplingParams, generate
from ..runtime.session import Session
from .text import ReplyText

LOG = logging.getLogger("anyfp4.serve")
GATHER_QUIET_SECONDS = 0.02  # a batch being gathered closes once no request came for this long,
GATHER_MAX_SECONDS = 0.25  # or this long after its first was taken
RECORDS_KEPT = 256  # GenerationRecords kept (a server's recent history, for logs and measurements)


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
class GenerationRecord:
    """One generation the worker ran: its requests, how long it gathered them (from taking the first), how long
    from its start to the first tokens (the prefill, and a first decode step's graph capture), and in all."""
    size: int
    gather_s: float
    first_tokens_s: float
    total_s: float


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


class _Ended(Exception):
    """Every job of the generation has ended (its limit, a stop, a cancel), or the server is stopping."""


class _Row:
    """One job's place in a generation: its tokens so far and the text they make (``ReplyText`` over ``text``, its
    ``ReplyDecoder``'s text under the tokenizer's lock, and ``whole``, the whole decode at the end)."""

    def __init__(self, job: Job, text: Callable[[list[int]], str], whole: Callable[[list[int]], str],
                 hold_back: tuple[str, ...]):
        self.job, self.produced, self.ended = job, [], False
        self.text = ReplyText(text, job.stops, job.incremental, hold_back, whole)

    def add(self, token: int) -> None:
        """The row's next token: its text delta out, and the row ended at a stop token, stop string or its limit."""
        params = self.job.params
        self.produced.append(token)
        delta, stopped = self.text.add(self.produced)
        if delta:
            self.job.push(TextDelta(delta))
        if stopped or token in params.stop_token_ids:  # a stop string (the text ends before it) or a stop token
            self.finish("stop")
        elif len(self.produced) >= params.max_new_tokens:
            self.finish("length")

    def finish(self, reason: str) -> None:
        """End the row with ``reason``: the rest of its text (what was held back so far), then ``Finished``."""
        self.ended = True
        rest = self.text.finish(self.produced)
        if rest:
            self.job.push(TextDelta(rest))
        self.job.push(Finished(reason, self.text.final, len(self.job.prompt), len(self.produced)))


class GenerationWorker:
    def __init__(self, session: Session, max_queue: int, max_batch: int = 1):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.session, self.max_queue, self.max_batch = session, max_queue, max_batch
        self.tokenizer_lock = threading.Lock()
        self.stopping = False
        self._jobs: deque[Job] = deque()
        self._closed = False
        self._arrived = 0  # jobs submitted so far: whether one came while a batch was gathered
        self._changed = threading.Condition()  # guards _jobs and _closed; notified when either changes
        self._thread: threading.Thread | None = None
        self.records: deque[GenerationRecord] = deque(maxlen=RECORDS_KEPT)  # the latest generations, oldest first
        self._gather_s = 0.0  # how long the batch _take returned last was gathered

    # -- the tokenizer, under its lock --------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return list(self.session.encode(text))

    def encode_chat(self, messages: list[dict]) -> list[int]:
        with self.tokenizer_lock:
            return self.session.encode_chat(messages)

    def _row(self, job: Job) -> _Row:
        with self.tokenizer_lock:
            decoder = self.session.reply_decoder(job.params)

        def text(tokens: list[int]) -> str:
            with self.tokenizer_lock:
                return decoder.text(tokens)

        def whole(tokens: list[int]) -> str:
            with self.tokenizer_lock:
                return self.session.reply_text(tokens, job.params)

        return _Row(job, text, whole, decoder.hold_back)

    # -- the queue ------------------------------------------------------------------------------------------

    def start(self, setup: Callable[[], object] | None = None) -> None:
        """Start the worker's thread (once: later calls do nothing); with ``setup``, run it first on that thread and
        return once it has returned (raising what it raised, the thread then ended). The weights load through
        ``setup`` in ``anyfp4 serve``: on the CPU every torch call then comes from the one thread, whose OpenMP
        team is then the process's only one (with a second team, from the thread that loaded, the threads
        outnumber a small machine's CPUs and OpenMP stops spinning between calls: ~10% slower decode on two)."""
        if self._thread is not None:
            return
        ready: Future = Future()

        def main() -> None:
            try:
                if setup is not None:
                    setup()
            except BaseException as error:  # noqa: BLE001 (handed to the caller of start)
                ready.set_exception(error)
                return
            ready.set_result(None)
            self._run()

        self._thread = threading.Thread(target=main, name="anyfp4-generation", daemon=True)
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._thread = None
            raise

    def submit(self, job: Job) -> None:
        """Queue ``job``; QueueFull when the queue is full, ShuttingDown once the server stops."""
        with self._changed:
            if self.stopping or self._thread is None:
                raise ShuttingDown
            if len(self._jobs) >= self.max_queue:
                raise QueueFull
            self._jobs.append(job)
            self._arrived += 1
            self._changed.notify_all()

    def waiting(self) -> int:
        """Jobs in the queue (not counting those generating)."""
        return len(self._jobs)

    def stop_accepting(self) -> None:
        """Safe in a signal handler: one assignment, no lock."""
        self.stopping = True

    def close(self, timeout: float | None = None) -> None:
        with self._changed:
            self.stopping = self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _shares(self, batch: list[Job], job: Job) -> bool:
        """Whether ``job`` can join ``batch``: greedy like it, the same stop tokens, the whole within the context
        (``Session.check_fits`` for the batch's prompts and its largest ``max_tokens``)."""
        first = batch[0].params
        if job.params.temperature != 0 or job.params.stop_token_ids != first.stop_token_ids:
            return False
        together = batch + [job]
        try:
            self.session.check_fits([j.prompt for j in together],
                                    replace(first, max_new_tokens=max(j.params.max_new_tokens for j in together)))
        except ValueError:
            return False
        return True

    def _take(self) -> list[Job] | None:
        """The next jobs to generate for together (None once closed): the first queued job, and with it, when it
        is greedy, the queued jobs that can share its generation (gathered as the module docstring says)."""
        with self._changed:
            while True:
                while self._jobs and self._jobs[0].cancelled:  # a client that left before its turn
                    self._jobs.popleft()
                if self._jobs or self._closed:
                    break
                self._changed.wait()
            if not self._jobs:
                return None
            batch = [self._jobs.popleft()]
            self._gather_s = 0.0
            if self.max_batch == 1 or batch[0].params.temperature != 0:
                return batch
            taken = time.monotonic()
            deadline = taken + GATHER_MAX_SECONDS
            while len(self._jobs) < self.max_batch - 1 and not self._closed and not self.stopping:
                wait, arrived = min(GATHER_QUIET_SECONDS, deadline - time.monotonic()), self._arrived
                if wait <= 0:
                    break
                self._changed.wait(wait)
                if self._arrived == arrived:  # none came: the company is all here
                    break
            for job in list(self._jobs):
                if len(batch) == self.max_batch:
                    break
                if not job.cancelled and self._shares(batch, job):
                    self._jobs.remove(job)
                    batch.append(job)
            self._gather_s = time.monotonic() - taken
            return batch

    def _run(self) -> None:
        device = self.session.model.device
        if device.type == "cuda":  # this thread's current device: where its kernels launch, its graphs are captured
            torch.cuda.set_device(device)
        while (batch := self._take()) is not None:
            batch = [job for job in batch if not job.cancelled]
            if self.stopping:
                for job in batch:
                    job.push(SHUTTING_DOWN)
                continue
            if batch:
                self._generate(batch)

    def _generate(self, batch: list[Job]) -> None:
        rows = [self._row(job) for job in batch]
        start, first_tokens = time.monotonic(), []
        params = replace(batch[0].params, max_new_tokens=max(job.params.max_new_tokens for job in batch))

        def on_tokens(step: list[int]) -> None:
            if not first_tokens:
                first_tokens.append(time.monotonic() - start)
            for row, token in zip(rows, step):
                if row.ended:
                    continue
                if row.job.cancelled or self.stopping:
                    row.ended = True
                    if not row.job.cancelled:
                        row.job.push(SHUTTING_DOWN)
                    continue
                row.add(token)
            if all(row.ended for row in rows):
                raise _Ended

        try:
            generate(self.session.model, [job.prompt for job in batch], params, on_tokens,
                     compile_decode=self.session.compile_decode)
        except _Ended:
            pass
        except Exception as error:  # a failed generation ends its open requests, not the server
            LOG.exception("generation failed")
            failed = Failed(500, f"generation failed: {type(error).__name__}: {error}", "generation_failed")
            for row in rows:
                if not row.ended:
                    row.ended = True
                    row.job.push(failed)
        for row in rows:  # every row ends at its limit at the latest: nothing is left open here
            if not row.ended:
                row.finish("length")
        record = GenerationRecord(len(batch), self._gather_s, first_tokens[0] if first_tokens else float("nan"),
                                  time.monotonic() - start)
        self.records.append(record)
        LOG.debug("generation: %s", record)
