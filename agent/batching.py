"""Dynamic batching: concurrent requests of the same shape run as one batch (Triton's semantics).

A request that arrives while a batch of its shape (same inputs, dtypes and non-batch dims) is
filling joins it; otherwise it opens a new one and leads it. The leader waits until the batch
holds ``max_batch_size`` rows or it has waited ``max_queue_delay_us``, then for a free run
slot (at most ``max_concurrent_batches`` batches run at once) — the batch keeps filling while
it waits, so with a delay of 0 requests still coalesce whenever the model is busy. The leader
then concatenates the inputs along axis 0, runs once and hands every member its rows of each
output (views into the batch's outputs), or the error, which each member raises.

No extra thread: the leader is one of the request threads (a hop to a scheduler thread and back
would cost more than most edge models' inference). A request on the event loop's thread (the
API's inline path for tiny models, taken only when nothing else is in flight) never waits for
company: it would block the very loop that would bring it.

What the caller does around it (agent/serving.py): the complete signature check, NaN/Inf scan
included, BEFORE a request joins (a bad request is refused alone and never poisons a batch);
the choice of variant inside ``run_batch`` (taken once per batch, so the governor's switches
fall between batches and every member reports the variant that ran); metrics per request.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgesdk.errors import AgentError
from edgesdk.schemas.agent_config import BatchingSettings

log = logging.getLogger("edgesdk.agent.batching")

Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
#: Runs checked feeds once; returns the outputs and a tag (the id of the variant that ran).
RunBatch = Callable[[Feeds], tuple[Outputs, str]]
#: What must be equal for two requests to share a batch: per input, its name, dtype, non-batch dims.
ShapeKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]


def has_batch_axis(input_shapes: list[tuple[Any, ...]], output_shapes: list[tuple[Any, ...]]) -> bool:
    """True when every input and output has a dynamic (named or None) first axis."""
    shapes = [*input_shapes, *output_shapes]
    return bool(input_shapes) and all(len(s) >= 1 and not isinstance(s[0], int) for s in shapes)


class BatchAbandonedError(AgentError):
    """A request's batch ended without running (its leading thread was interrupted)."""


class _Member:
    """One request in a batch: its feeds and rows; then its outputs or error, and ``done``."""

    __slots__ = ("feeds", "rows", "done", "outputs", "tag", "error")

    def __init__(self, feeds: Feeds, rows: int) -> None:
        self.feeds = feeds
        self.rows = rows
        self.done = threading.Event()
        self.outputs: Outputs | None = None
        self.tag = ""
        self.error: BaseException | None = None


class _Batch:
    __slots__ = ("members", "rows", "full")

    def __init__(self, first: _Member) -> None:
        self.members = [first]
        self.rows = first.rows
        self.full = threading.Event()


class DynamicBatcher:
    """Coalesces concurrent ``run`` calls into batches of ``run_batch`` (thread-safe)."""

    def __init__(self, run_batch: RunBatch, settings: BatchingSettings) -> None:
        self.run_batch = run_batch
        self.max_rows = settings.max_batch_size
        self.max_delay_s = settings.max_queue_delay_us / 1e6
        self._slots = threading.BoundedSemaphore(settings.max_concurrent_batches)
        self._lock = threading.Lock()  # guards _filling and every filling batch's members/rows
        self._filling: dict[ShapeKey, _Batch] = {}
        self._waiting = 0  # requests in batches not started yet; changed under _lock
        # False once a model answered a batch with outputs that are not one row per input row
        # (its first output axis is not a batch axis after all): then every request runs alone.
        self.splittable = True
        self.batches_run = 0  # batches of more than one request (tests, logs)

    def waiting(self) -> int:
        """Requests in batches that have not started yet (filling, or full and waiting to run)."""
        return self._waiting

    def run(self, feeds: Feeds) -> tuple[Outputs, str]:
        """Run ``feeds`` (already checked) in a batch; returns its outputs and the batch's tag."""
        rows = _rows(feeds)
        if not 0 < rows <= self.max_rows or not self.splittable:
            return self.run_batch(feeds)  # too large to share, or sharing is off: alone, as unbatched
        key = _shape_key(feeds)
        member = _Member(feeds, rows)
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
                leading = self._filling[key] = _Batch(member)
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

    def _execute(self, members: list[_Member]) -> None:
        if len(members) == 1:
            _run_alone(self.run_batch, members[0])
            return
        names = list(members[0].feeds)
        total = sum(m.rows for m in members)
        try:
            feeds = {name: np.concatenate([m.feeds[name] for m in members]) for name in names}
            outputs, tag = self.run_batch(feeds)
        except BaseException as exc:  # noqa: BLE001 - every member raises it in its own thread
            for index, m in enumerate(members):
                m.error = exc if index == 0 else _copy_error(exc)
            return
        self.batches_run += 1
        log.debug("ran %d requests (%d rows) as one batch on %s", len(members), total, tag)
        if any(out.ndim == 0 or out.shape[0] != total for out in outputs.values()):
            # Not one output row per input row: this model cannot be split back. Answer each
            # request from its own run, and stop batching this model.
            self.splittable = False
            log.warning(
                "batched outputs %s do not have %d rows: dynamic batching turned off for this model",
                {n: list(o.shape) for n, o in outputs.items()},
                total,
            )
            for m in members:
                _run_alone(self.run_batch, m)
            return
        start = 0
        for m in members:
            end = start + m.rows
            m.outputs = {name: out[start:end] for name, out in outputs.items()}
            m.tag = tag
            start = end


def _rows(feeds: Feeds) -> int:
    """The request's batch size: its inputs' common first dim; -1 when they differ (or have none),
    which makes the request run alone, exactly as it would unbatched."""
    sizes = {array.shape[0] if array.ndim else -1 for array in feeds.values()}
    return int(sizes.pop()) if len(sizes) == 1 else -1


def _shape_key(feeds: Feeds) -> ShapeKey:
    return tuple((name, array.dtype, array.shape[1:]) for name, array in feeds.items())


def _run_alone(run_batch: RunBatch, member: _Member) -> None:
    try:
        member.outputs, member.tag = run_batch(member.feeds)
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


def _result(member: _Member) -> tuple[Outputs, str]:
    if member.error is not None:
        raise member.error
    if member.outputs is None:
        raise BatchAbandonedError("the batch this request was in ended without its outputs")
    return member.outputs, member.tag
