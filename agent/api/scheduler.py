"""Where an inference runs, and whether it may: one scheduler for every transport.

REST v1, Open Inference v2 over HTTP and over gRPC, and ``/predict`` hand it the same two
things: their *work* (a callable that decodes the body, runs it through ``ModelServer`` and
encodes an :class:`~edgesdk.agent.api.answer.Answer`), and a *reply* (called once, on the event
loop, with that Answer or the ``ErrorAnswer`` of the error the work raised). It decides:

* admission: at most ``max_concurrency`` inferences run at once (the size of the thread pool)
  and at most ``max_queue`` more wait; beyond that the reply is a 503 with ``Retry-After`` at
  once, so a flood costs a few microseconds per refused request and never unbounded memory;
* inline or pool: decoding, inference and encoding run in the pool, so a large body cannot
  stall other connections. One exception: when recent requests took less than
  ``inline_max_ms`` (a tiny model; the shortest of the last eight, so preempted runs do not
  count), a small request is answered on the event loop itself, because the two thread hops
  would cost more than the inference (with dynamic batching on, only when nothing else is in
  flight). ``took`` folds each answer's time into that decision; the prepared route
  (``prepared.py``) reads the same decision and feeds it its own answers' times;
* batches, one mechanism for both kinds of model (``agent/batching.py``'s ``BatchFormer``, one
  per model with a batch axis): a tiny model's requests that one wake-up of the loop brings run
  inline as one batch of at most ``inline_batch_max`` rows (``batch``; the prepared route offers
  them); a large model's pool requests, with ``[api.batching]`` on, wait in the same former up to
  ``max_queue_delay_us`` for ``max_batch_size`` rows (inside ``ModelServer.infer``);
* the deadline: a request in the pool not answered within ``request_timeout_s`` is a 504.

After the reply, the server's post-answer taps (``ModelServer.taps``) get the answer's
inference. The transports see only :class:`Answer` and ``ErrorAnswer``: no HTTP type here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass

from edgesdk.agent.api.answer import Answer
from edgesdk.agent.api.budget import InflightBytesBudget
from edgesdk.agent.api.refusal import (
    AgentStoppingError,
    AnswerTimeoutError,
    AtCapacityError,
    ErrorAnswer,
    QueueExpiredError,
    refusal_of,
)
from edgesdk.agent.batching import BatchFormer, Feeds, Member
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.agent_config import ApiConfig

log = logging.getLogger("edgesdk.agent.api")

#: Bodies above this always go to the pool (decoding alone could block the loop).
INLINE_MAX_BODY = 64 * 1024
#: Answers in a row at or over inline_max_s that send a tiny model's next requests to the pool.
_INLINE_RUNS = 8

#: An inference: decode, run, encode; raises what ``refusal.py`` answers.
Work = Callable[[], Answer]
#: Where its outcome goes (on the event loop, once).
Reply = Callable[[Answer | ErrorAnswer], None]


@dataclass(slots=True)
class _InPool:
    """A request in the pool: its reply, its 504 timer, and whether it has been replied to."""

    reply: Reply
    timer: asyncio.TimerHandle | None = None
    replied: bool = False


class Scheduler:
    """Admission, inline-or-pool and the deadline for every transport's inferences (see module)."""

    def __init__(self, server: ModelServer, metrics: Metrics, config: ApiConfig) -> None:
        self.server = server
        self.metrics = metrics
        self.config = config
        # Requests waiting in a filling batch hold a thread each (agent/batching.py).
        threads = config.batching.pool_threads(config.max_concurrency)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="infer")
        self.capacity = config.max_concurrency + config.max_queue
        # Running + waiting, counted only on the event loop thread; the metrics' own counter,
        # so /metrics and telemetry report exactly what admission control sees (queue_depth).
        self.requests = metrics.requests
        self.inline_max_s = config.inline_max_ms / 1000.0
        # Slow answers still allowed before the pool takes over (see took); 0 until a run is
        # measured, so the first goes to the pool.
        self.inline_left = 0
        self._slow_s = 10 * self.inline_max_s
        self._slow_last = False  # the last slow answer took over _slow_s
        # With dynamic batching a request waits for others in the batcher: never on the loop
        # beside requests in the pool (the loop would wait for a batch it keeps from filling).
        batching = config.batching
        self.inline_beside_others = not (batching.enabled or any(m.enabled for m in batching.models.values()))
        # Requests of a tiny model that one wake-up of the loop brings, run as one batch (prepared.py).
        self.inline_batch_max = config.inline_batch_max
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Event | None = None

    def refuse(self, exc: BaseException, where: str = "") -> ErrorAnswer:
        """``exc`` as its class answers it (refusal.py), counted."""
        refusal = refusal_of(exc, where)
        if refusal.error_kind is not None:
            self.metrics.count_error(refusal.error_kind)
        return refusal

    def submit(
        self, work: Work, reply: Reply, *, size: int, may_inline: bool = True, where: str = ""
    ) -> Answer | ErrorAnswer | None:
        """Run ``work`` inline or in the pool and ``reply`` with its outcome (on the loop thread).
        Returns the outcome when it was replied before returning (inline, or refused at
        admission); None when the pool will. ``size``: the body's bytes (large ones never run
        inline); ``may_inline`` False keeps work that may block (image decoding) off the loop."""
        requests = self.requests
        if requests.count >= self.capacity:
            refusal = self.refuse(AtCapacityError("agent is at capacity; retry shortly"))
            reply(refusal)
            return refusal
        if (
            self.inline_left
            and size <= INLINE_MAX_BODY
            and (requests.count == 0 or self.inline_beside_others)
            and may_inline
        ):
            # This model answers in well under a millisecond: the two thread hops would cost
            # more than the inference, and blocking the loop this briefly delays nobody. Also
            # while others are in the pool: else, once a preempted run had sent some there,
            # sixteen busy clients kept every request in the pool (count never back to 0),
            # at ~2x the CPU per answer. (No queue, so no expiry check: it starts now.)
            requests.count += 1
            started = time.perf_counter()
            try:
                outcome = work()  # _run, written out: one call fewer on a tiny model's every answer
            except Exception as exc:  # noqa: BLE001 - a bug in one request is a 500, never a dead agent
                outcome = self.refuse(exc, where)
            finally:
                requests.count -= 1
            took = time.perf_counter() - started
            reply(outcome)  # first: what follows is bookkeeping the client need not wait for
            if type(outcome) is Answer and outcome.served is not None:
                self.server.tap(*outcome.served)
            # (No drain() wake-up: the count is back where it was before this request, all in
            # one callback of the loop; drain() is woken by _finish, the pool's answers.)
            self.took(took)
            return outcome
        requests.count += 1
        in_pool = _InPool(reply)
        future = self.pool.submit(self._work, work, where, time.monotonic())
        loop = self.loop or asyncio.get_running_loop()
        in_pool.timer = loop.call_later(self.config.request_timeout_s, self._too_late, in_pool)

        def done(fut: Future[Answer | ErrorAnswer]) -> None:
            # Runs in the worker thread: hop back onto the loop to reply.
            loop.call_soon_threadsafe(self._finish, fut, in_pool)

        future.add_done_callback(done)
        return None

    def batch(
        self,
        former: BatchFormer,
        key: Hashable,
        feeds: Feeds,
        rows: int,
        nbytes: int,
        done: Callable[[list[Member]], None],
        context: object,
        budget: InflightBytesBudget,
    ) -> bool:
        """Take a tiny model's checked inline request into the batch its former forms from this
        wake-up of the loop (``BatchFormer.join``: at most ``inline_batch_max`` rows, run on the
        loop's next turn, then ``done`` with the members, each carrying its ``context``); False:
        answer it now, alone."""
        loop = self.loop or asyncio.get_running_loop()
        return former.join(key, feeds, rows, nbytes, done, context, self.inline_batch_max, loop, budget)

    def submit_from_thread(self, work: Work, *, size: int, where: str = "") -> Answer | ErrorAnswer:
        """``submit`` from a thread other than the event loop's (the gRPC server's): hops onto
        the loop, blocks until the outcome (or the 504 after ``request_timeout_s``)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return self.refuse(AgentStoppingError("the agent is stopping"))
        outcome: Future[Answer | ErrorAnswer] = Future()

        def reply(result: Answer | ErrorAnswer) -> None:
            if not outcome.done():  # a 504 may come first; the worker's outcome then finds it done
                outcome.set_result(result)

        def submit() -> None:
            try:
                self.submit(work, reply, size=size, where=where)
            except RuntimeError:  # the pool was shut down: the agent is stopping
                reply(self.refuse(AgentStoppingError("the agent is stopping")))

        try:
            loop.call_soon_threadsafe(submit)
        except RuntimeError:  # the loop closed meanwhile
            return self.refuse(AgentStoppingError("the agent is stopping"))
        try:
            # The loop answers within request_timeout_s (its 504); the margin covers a stopping loop.
            return outcome.result(timeout=self.config.request_timeout_s + 5)
        except FutureTimeoutError:
            return self.refuse(AgentStoppingError("the agent is stopping"))

    def _run(self, work: Work, where: str) -> Answer | ErrorAnswer:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - a bug in one request is a 500, never a dead agent
            return self.refuse(exc, where)

    def _work(self, work: Work, where: str, enqueued: float) -> Answer | ErrorAnswer:
        if time.monotonic() - enqueued > self.config.request_timeout_s:
            return self.refuse(QueueExpiredError("request expired in the queue"))
        started = time.perf_counter()
        outcome = self._run(work, where)
        self.took(time.perf_counter() - started)
        return outcome

    def _too_late(self, in_pool: _InPool) -> None:
        in_pool.replied = True
        in_pool.reply(self.refuse(AnswerTimeoutError(f"no answer within {self.config.request_timeout_s:g} s")))

    def _finish(self, future: Future[Answer | ErrorAnswer], in_pool: _InPool) -> None:
        if in_pool.timer is not None:
            in_pool.timer.cancel()
        self.requests.count -= 1
        try:
            outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - _work turns every expected error into an ErrorAnswer
            outcome = self.refuse(exc, "the inference pool")
        if not in_pool.replied:  # else its 504 went out; this outcome is dropped
            in_pool.replied = True
            in_pool.reply(outcome)
            if type(outcome) is Answer and outcome.served is not None:
                self.server.tap(*outcome.served)
        if self.requests.count == 0 and self._drained is not None:
            self._drained.set()

    def took(self, took: float) -> None:
        """Fold one answer's duration into the inline decision: a tiny model is answered on the
        loop while one of the last eight answers took under ``inline_max_s``. ``inline_left``
        counts down the slow answers since the last fast one (the shortest of the last eight
        is under the threshold while it is above 0), so a fast answer, nearly every one, is
        one comparison and one store.

        Why the shortest: these are wall-clock times (what blocks the loop, a wait on an
        accelerator included), and on a loaded machine a tiny model's run is often preempted
        for milliseconds; an average (as before) then sent its requests through the pool, two
        thread hops each, at 1.5-2x the CPU per answer at load 9-10. A model that is really
        slow (another one swapped in, a device to wait for) is slow every time: two runs in a
        row over ten times the threshold send the next ones to the pool, until a fast run there
        says otherwise. Not one alone: on a loaded 2-core machine a 40 µs run is preempted
        for milliseconds every few hundred requests, and each such run sent the next ones
        through the pool (in process, one client, load ~8: 137 of 5,000 requests through the
        pool with one slow run enough, 41 with two in a row). (A race between pool threads
        only blurs this; it decides a fast path.)"""
        if took < self.inline_max_s:
            self.inline_left = _INLINE_RUNS
            return
        very_slow = took > self._slow_s
        # The answer before was slow too when the count is down (a fast one refills it), and
        # _slow_last says whether it was far over: two in a row, the pool from now on.
        if very_slow and self._slow_last and self.inline_left < _INLINE_RUNS:
            self.inline_left = 0
        elif self.inline_left:
            self.inline_left -= 1
        self._slow_last = very_slow

    @property
    def in_flight(self) -> int:
        """Requests running or waiting now."""
        return self.requests.count

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no request is running or queued (SIGTERM); False on timeout."""
        if self.requests.count == 0:
            return True
        self._drained = asyncio.Event()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
