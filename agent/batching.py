"""The agent's one batching mechanism: :class:`BatchFormer`, one per served model with a batch axis.

Requests whose feeds have the same shape (same inputs, dtypes and non-batch dims) join one
*forming* batch; it closes, runs once on the inputs concatenated along axis 0 and hands every
member its rows of each output (views into the batch's outputs), or the error, which each member
gets as its own. Two ways in, one former, one run and split-back (``_execute``):

* ``join`` — on the event loop (the scheduler's inline route for a tiny model): the requests one
  wake-up of the loop brings, from several connections, join; the batch closes on the loop's next
  turn (one ``call_soon``), so nobody waits for company that is not already there, and runs
  inline. The caller says how many rows it may hold (``api.inline_batch_max``).
* ``run`` — from a pool thread (``[api.batching]`` on, Triton's semantics): a request joins the
  forming batch of its shape or opens one and leads it; the leader waits until the batch holds
  ``max_batch_size`` rows or it has waited ``max_queue_delay_us``, then for a free run slot (at
  most ``max_concurrent_batches`` batches run at once) — the batch keeps filling while it waits,
  so with a delay of 0 requests still coalesce whenever the model is busy. No extra thread: the
  leader is one of the request threads (a hop to a scheduler thread and back would cost more than
  most edge models' inference). A request on the event loop's thread never waits for company.

The same guarantees either way: each member's answer is what it would be unbatched (the variant
taken once per batch, so the governor's switches fall between batches); a model whose outputs are
not one row per input row (its first axis is not a batch axis after all) answers each member from
its own run and is never batched again (``splittable``); a batch whose stacked copy of the inputs
does not fit the memory budget given runs each member alone; an error of the run is each member's.
What the caller does around it: every check of a request, NaN/Inf scan included, BEFORE it joins
(a bad request is refused alone and never poisons a batch); admission, deadlines and metrics.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import AgentError
from edgesdk.schemas.agent_config import BatchingSettings

if TYPE_CHECKING:
    from edgesdk.agent.api.budget import InflightBytesBudget

log = logging.getLogger("edgesdk.agent.batching")

Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
#: Runs checked feeds once; returns the outputs and a tag (the id of the variant that ran).
RunBatch = Callable[[Feeds], tuple[Outputs, str]]
#: What must be equal for two requests to share a batch: per input, its name, dtype, non-batch dims.
ShapeKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]

#: The ``full`` of every batch on the loop: no one waits there (an Event costs ~10 µs to make).
_NO_WAIT = threading.Event()

#: After a batch on the loop ran alone, one request in about this many waits a turn of the loop
#: for company (``join``): clients come and go.
PROBE_EVERY = 16


def has_batch_axis(input_shapes: list[tuple[Any, ...]], output_shapes: list[tuple[Any, ...]]) -> bool:
    """True when every input and output has a dynamic (named or None) first axis."""
    shapes = [*input_shapes, *output_shapes]
    return bool(input_shapes) and all(len(s) >= 1 and not isinstance(s[0], int) for s in shapes)


class BatchAbandonedError(AgentError):
    """A request's batch ended without running (its leading thread was interrupted)."""


class Member:
    """One request in a batch: its feeds and rows; then its outputs or error, the tag, and the
    batch's run time and size (``company``); ``done`` is set (thread) or called with the batch's
    members (loop) once."""

    __slots__ = ("feeds", "rows", "done", "context", "outputs", "tag", "error", "ran", "company")

    def __init__(self, feeds: Feeds, rows: int, done: Any, context: Any = None) -> None:
        self.feeds = feeds
        self.rows = rows
        #: threading.Event (``run``), or the callback that takes the batch's members (``join``).
        self.done = done
        #: What the caller of ``join`` needs to answer it (its reply, what it holds).
        self.context = context
        self.outputs: Outputs | None = None
        self.tag = ""
        self.error: BaseException | None = None
        self.ran = 0.0
        self.company = 1


class _Batch:
    __slots__ = ("members", "rows", "full", "budget", "nbytes")

    def __init__(self, first: Member, full: threading.Event, budget: InflightBytesBudget | None = None) -> None:
        self.members = [first]
        self.rows = first.rows
        self.full = full  # set when a pool batch may start (on the loop: _NO_WAIT, no one waits)
        self.budget = budget
        self.nbytes = 0  # the inputs' bytes (loop batches: what stacking them copies)


class BatchFormer:
    """One model's batches: ``join`` on the event loop, ``run`` in pool threads (see module)."""

    def __init__(self, run_batch: RunBatch, settings: BatchingSettings) -> None:
        self.run_batch = run_batch
        #: Whether pool requests wait for company (``[api.batching]`` on for this model).
        self.pooled = settings.enabled and settings.max_batch_size > 1
        self.max_rows = settings.max_batch_size
        self.max_delay_s = settings.max_queue_delay_us / 1e6
        self._slots = threading.BoundedSemaphore(settings.max_concurrent_batches)
        self._lock = threading.Lock()  # guards _filling and every filling batch's members/rows
        self._filling: dict[ShapeKey, _Batch] = {}
        self._waiting = 0  # requests in pool batches not started yet; changed under _lock
        #: The batches forming on the loop this wake-up, by shape (its thread only).
        self.forming: dict[Hashable, _Batch] = {}
        # False once a model answered a batch with outputs that are not one row per input row:
        # then every request runs alone.
        self.splittable = True
        self.batches_run = 0  # batches of more than one request (tests, logs)
        self.company = 0  # members of the last batch run on the loop
        self._probe_left = PROBE_EVERY
        self._probes = 0

    def waiting(self) -> int:
        """Requests in pool batches that have not started yet (filling, or full and waiting)."""
        return self._waiting

    # -- on the event loop --------------------------------------------------------------------

    def probe(self) -> bool:
        """Whether a request on the loop should be offered to ``join`` although no batch forms
        this wake-up and the last one ran alone: about every ``PROBE_EVERY``-th (a lone request
        waiting for nobody would only lose the loop's turn). Callers offer every request while
        ``forming`` or the last batch had ``company``; asked before the request is decoded, so a
        declined one costs a counter."""
        self._probe_left -= 1
        if self._probe_left > 0:
            return False
        # The period varies (16-22): a fixed one could keep landing on the last read of each
        # wake-up (a client pattern of that period), which finds no company.
        self._probes += 1
        self._probe_left = PROBE_EVERY + self._probes % 7
        return True

    def join(
        self,
        key: Hashable,
        feeds: Feeds,
        rows: int,
        nbytes: int,
        done: Callable[[list[Member]], None],
        context: Any,
        max_rows: int,
        loop: asyncio.AbstractEventLoop,
        budget: InflightBytesBudget | None = None,
    ) -> bool:
        """Take checked ``feeds`` (``rows`` rows, ``nbytes`` bytes) into the batch this wake-up
        of ``loop`` forms for ``key`` (at most ``max_rows`` rows), run on the loop's next turn;
        then ``done`` is called once with the batch's members it brought (each carrying its
        ``context``; pass the same object for every request of one caller, so that it is called
        once per batch). ``key``: equal only for requests that stack (same inputs, dtypes,
        non-batch dims); the caller knows as much (the prepared route: the model's one input,
        whose other axes its signature fixes). False: not taken (the batch is full, the model
        cannot be split), run it now. ``budget`` is charged the stacked copy of the inputs while
        the batch runs."""
        if not self.splittable or not 0 < rows <= max_rows:
            return False
        forming = self.forming
        batch = forming.get(key)
        if batch is None:
            batch = forming[key] = _Batch(Member(feeds, rows, done, context), _NO_WAIT, budget)
            batch.nbytes = nbytes
            loop.call_soon(self._close_on_loop, key)
            return True
        if batch.rows + rows > max_rows:
            return False
        batch.members.append(Member(feeds, rows, done, context))
        batch.rows += rows
        batch.nbytes += nbytes
        return True

    def _close_on_loop(self, key: Hashable) -> None:
        batch = self.forming.pop(key)
        members = batch.members
        self.company = len(members)
        self._execute(members, batch.budget, batch.nbytes)
        done = members[0].done
        if all(member.done is done for member in members):  # one caller's (one route's) batch
            callers = [(done, members)]
        else:  # each caller once, with its own members
            callers = [(d, [m for m in members if m.done == d]) for d in dict.fromkeys(m.done for m in members)]
        for done, its_members in callers:
            try:
                done(its_members)
            except Exception:  # noqa: BLE001 - one caller's failure must not keep the others waiting
                log.exception("answering batched requests failed")

    # -- in pool threads ----------------------------------------------------------------------

    def run(self, feeds: Feeds) -> tuple[Outputs, str]:
        """Run ``feeds`` (already checked) in a batch; returns its outputs and the batch's tag."""
        rows = _rows(feeds)
        if not 0 < rows <= self.max_rows or not self.splittable:
            return self.run_batch(feeds)  # too large to share, or sharing is off: alone, as unbatched
        key = _shape_key(feeds)
        member = Member(feeds, rows, threading.Event())
        with self._lock:
            self._waiting += 1
            batch = self._filling.get(key)
            if batch is not None and batch.rows + rows <= self.max_rows:
                batch.members.append(member)
                batch.rows += rows
                if batch.rows == self.max_rows:
                    del self._filling[key]  # full: no one else joins; its leader starts
                    batch.full.set()
                leading = None
            else:
                if batch is not None:  # this one does not fit: the filling batch starts as it is
                    batch.full.set()
                leading = self._filling[key] = _Batch(member, threading.Event())
        if leading is None:
            member.done.wait()
            return _result(member)
        self._lead(key, leading)
        return _result(member)

    def _lead(self, key: ShapeKey, batch: _Batch) -> None:
        if self.max_delay_s > 0 and asyncio._get_running_loop() is None:
            batch.full.wait(self.max_delay_s)
        try:
            with self._slots:
                with self._lock:
                    if self._filling.get(key) is batch:
                        del self._filling[key]
                    self._waiting -= len(batch.members)
                self._execute(batch.members)  # final: the batch left _filling under the lock
        finally:
            for follower in batch.members[1:]:
                if follower.outputs is None and follower.error is None:  # the leader itself failed
                    follower.error = BatchAbandonedError("the batch this request was in did not run")
                follower.done.set()

    # -- one run, split back ------------------------------------------------------------------

    def _execute(self, members: list[Member], budget: InflightBytesBudget | None = None, stack: int = 0) -> None:
        """Run ``members`` as one batch; ``stack``: their inputs' bytes, charged to ``budget``
        while the batch runs (the stacked copy is memory of its own), or each member runs alone."""
        if len(members) == 1:
            _run_alone(self.run_batch, members[0])
            return
        if budget is not None and not budget.try_take(stack):
            for m in members:
                _run_alone(self.run_batch, m)
            return
        try:
            self._run_stacked(members)
        finally:
            if budget is not None:
                budget.give_back(stack)

    def _run_stacked(self, members: list[Member]) -> None:
        names = list(members[0].feeds)
        total = sum(m.rows for m in members)
        try:
            feeds = {name: np.concatenate([m.feeds[name] for m in members]) for name in names}
            started = perf_counter()
            outputs, tag = self.run_batch(feeds)
            ran = perf_counter() - started
        except BaseException as exc:  # noqa: BLE001 - every member gets it (its thread raises it)
            for index, m in enumerate(members):
                m.error = exc if index == 0 else _copy_error(exc)
                m.company = len(members)
            return
        self.batches_run += 1
        log.debug("ran %d requests (%d rows) as one batch on %s", len(members), total, tag)
        if any(out.ndim == 0 or out.shape[0] != total for out in outputs.values()):
            # Not one output row per input row: this model cannot be split back. Answer each
            # request from its own run, and stop batching this model.
            self.splittable = False
            log.warning(
                "batched outputs %s do not have %d rows: batching turned off for this model",
                {n: list(o.shape) for n, o in outputs.items()},
                total,
            )
            for m in members:
                _run_alone(self.run_batch, m)
            return
        start, company = 0, len(members)
        for m in members:
            end = start + m.rows
            m.outputs = {name: out[start:end] for name, out in outputs.items()}
            m.tag, m.ran, m.company = tag, ran, company
            start = end


def _rows(feeds: Feeds) -> int:
    """The request's batch size: its inputs' common first dim; -1 when they differ (or have none),
    which makes the request run alone, exactly as it would unbatched."""
    sizes = {array.shape[0] if array.ndim else -1 for array in feeds.values()}
    return int(sizes.pop()) if len(sizes) == 1 else -1


def _shape_key(feeds: Feeds) -> ShapeKey:
    return tuple((name, array.dtype, array.shape[1:]) for name, array in feeds.items())


def _run_alone(run_batch: RunBatch, member: Member) -> None:
    try:
        started = perf_counter()
        member.outputs, member.tag = run_batch(member.feeds)
        member.ran = perf_counter() - started
    except BaseException as exc:  # noqa: BLE001 - raised by the member's own thread
        member.error = exc


def _copy_error(exc: BaseException) -> BaseException:
    """The same error for another thread to raise: one exception object raised in several threads
    at once would collect all their tracebacks."""
    try:
        twin = copy.copy(exc)
    except Exception as failure:  # noqa: BLE001 - an exception type that cannot be copied: share it
        log.debug("%s cannot be copied (%s): the batch's requests share one error object", type(exc).__name__, failure)
        return exc
    twin.__traceback__ = None
    twin.__cause__ = exc
    return twin


def _result(member: Member) -> tuple[Outputs, str]:
    if member.error is not None:
        raise member.error
    if member.outputs is None:
        raise BatchAbandonedError("the batch this request was in ended without its outputs")
    return member.outputs, member.tag
