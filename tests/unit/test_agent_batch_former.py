"""The one batching mechanism (agent/batching.py's BatchFormer) on both of its ways in, with a fake
run (y = 2x): a tiny model's requests of one wake-up of the event loop (``join``) and a large
model's pool requests (``run``) go through the same former and the same run-and-split, each member
gets what it would unbatched, and the loop's batches keep the guarantees the pool's have: shapes
kept apart, the row limit, an error each member's own, outputs that cannot be split answered one
by one (and never batched again), the memory budget charged for the stacked copy, a broken
caller's answer never keeping the others waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.api.budget import InflightBytesBudget
from edgesdk.agent.batching import PROBE_EVERY, BatchFormer, Member

from edgesdk.schemas.agent_config import BatchingSettings


class Run:
    """A ``run_batch``: y = 2x (``rows`` overrides how many rows it answers); every call recorded."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.fail: Exception | None = None
        self.rows: int | None = None
        self.budget: InflightBytesBudget | None = None
        self.used_while_running: list[int] = []

    def __call__(self, feeds: Any) -> tuple[dict[str, np.ndarray], str]:
        self.calls.append(feeds["x"])
        if self.budget is not None:
            self.used_while_running.append(self.budget.used)
        if self.fail is not None:
            raise self.fail
        y = feeds["x"] * np.float32(2)
        return {"y": y if self.rows is None else y[: self.rows]}, "fp32"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def former(run: Run, **overrides: Any) -> BatchFormer:
    base = {"enabled": True, "max_batch_size": 8, "max_queue_delay_us": 0, "max_concurrent_batches": 1}
    return BatchFormer(run, BatchingSettings(**{**base, **overrides}))


def x(value: float, rows: int = 1, width: int = 4) -> np.ndarray:
    return np.full((rows, width), value, np.float32)


def stackable(feeds: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray], int, int]:
    """``join``'s first four arguments: a key equal for feeds that stack (names, dtypes, non-batch
    dims), the feeds, their rows, their bytes."""
    key = tuple((name, array.dtype, array.shape[1:]) for name, array in feeds.items())
    (rows,) = {len(array) for array in feeds.values()}
    return key, feeds, rows, sum(array.nbytes for array in feeds.values())


def one_wake_up(
    loop: asyncio.AbstractEventLoop, batches: BatchFormer, feeds: list[dict[str, np.ndarray]], max_rows: int = 8
) -> tuple[list[bool], list[Member]]:
    """``join`` each of ``feeds`` in one callback of the loop, then let the loop run the batches;
    returns whether each was taken and the members handed back, in the order they were."""
    taken: list[bool] = []
    answered: list[Member] = []

    def reads() -> None:
        for f in feeds:
            taken.append(batches.join(*stackable(f), answered.extend, None, max_rows, loop))

    loop.call_soon(reads)
    loop.run_until_complete(asyncio.sleep(0.01))
    return taken, answered


def test_loop_and_pool_requests_share_one_former_and_get_what_they_would_unbatched(
    loop: asyncio.AbstractEventLoop,
) -> None:
    run = Run()
    batches = former(run)
    inputs = [{"x": x(float(i), rows=1 + i % 2)} for i in range(4)]
    taken, answered = one_wake_up(loop, batches, inputs)
    assert taken == [True] * 4 and len(run.calls) == 1 and len(run.calls[0]) == 6  # one run, 6 rows
    for member, feeds in zip(answered, inputs, strict=True):
        np.testing.assert_array_equal(member.outputs["y"], feeds["x"] * 2)  # type: ignore[index]
        assert member.error is None and member.company == 4 and member.tag == "fp32"
    assert batches.company == 4
    # The same former's pool side: threads' requests answered their own rows too.
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(batches.run, inputs))
    for (outputs, tag), feeds in zip(results, inputs, strict=True):
        np.testing.assert_array_equal(outputs["y"], feeds["x"] * 2)
        assert tag == "fp32"


def test_loop_batches_keep_shapes_apart_and_respect_the_row_limit(loop: asyncio.AbstractEventLoop) -> None:
    run = Run()
    batches = former(run)
    inputs = [{"x": x(1.0)}, {"x": x(2.0, width=3)}, {"x": x(3.0)}, {"x": x(4.0, rows=2)}, {"x": x(5.0, rows=5)}]
    taken, answered = one_wake_up(loop, batches, inputs, max_rows=4)
    # Width 4: 1 + 1 + 2 rows fill the batch of 4; the 5-row request is over the limit: run it now.
    assert taken == [True, True, True, True, False]
    assert sorted(len(c) for c in run.calls) == [1, 4]  # the width-3 one alone, the others together
    assert len(answered) == 4 and all(m.error is None for m in answered)


def test_an_error_of_a_loop_batch_is_each_members_own(loop: asyncio.AbstractEventLoop) -> None:
    run = Run()
    run.fail = RuntimeError("batch size fixed at 1")
    batches = former(run)
    _, answered = one_wake_up(loop, batches, [{"x": x(float(i))} for i in range(3)])
    errors = [m.error for m in answered]
    assert all(isinstance(e, RuntimeError) and "fixed at 1" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == 3  # one object each: raised in three places at once
    assert all(m.outputs is None and m.company == 3 for m in answered)


def test_a_loop_batch_whose_outputs_cannot_be_split_answers_each_alone_and_stops_batching(
    loop: asyncio.AbstractEventLoop,
) -> None:
    run = Run()
    run.rows = 1  # one row whatever it is given
    batches = former(run)
    inputs = [{"x": x(float(i))} for i in range(3)]
    _, answered = one_wake_up(loop, batches, inputs)
    assert [len(c) for c in run.calls] == [3, 1, 1, 1]  # the batch, then each alone
    for member, feeds in zip(answered, inputs, strict=True):
        np.testing.assert_array_equal(member.outputs["y"], feeds["x"] * 2)  # type: ignore[index]
    assert not batches.splittable
    taken, _ = one_wake_up(loop, batches, inputs)
    assert taken == [False] * 3


def test_a_loop_batch_holds_its_stacked_inputs_in_the_memory_budget(loop: asyncio.AbstractEventLoop) -> None:
    run = Run()
    batches = former(run)
    stack = 3 * x(0.0).nbytes
    for capacity, runs in ((stack, [3]), (stack - 1, [1, 1, 1])):
        budget = InflightBytesBudget(capacity)
        run.budget, run.calls, run.used_while_running = budget, [], []
        answered: list[Member] = []

        def reads(budget: InflightBytesBudget = budget, answered: list[Member] = answered) -> None:
            for i in range(3):
                assert batches.join(*stackable({"x": x(float(i))}), answered.extend, None, 8, loop, budget)

        loop.call_soon(reads)
        loop.run_until_complete(asyncio.sleep(0.01))
        assert [len(c) for c in run.calls] == runs  # fits: one run; a byte short: one each
        assert run.used_while_running == ([stack] if runs == [3] else [0, 0, 0])
        assert budget.used == 0 and all(m.error is None for m in answered)


def test_a_loop_batch_caller_whose_answer_fails_does_not_keep_the_other_callers_waiting(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = former(Run())
    answered: list[Member] = []

    def broken(members: list[Member]) -> None:
        raise ConnectionResetError("the client went away")

    def reads() -> None:
        assert batches.join(*stackable({"x": x(1.0)}), broken, None, 8, loop)
        assert batches.join(*stackable({"x": x(2.0)}), answered.extend, None, 8, loop)

    loop.call_soon(reads)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert len(answered) == 1
    np.testing.assert_array_equal(answered[0].outputs["y"], x(4.0))  # type: ignore[index]


def test_after_lone_batches_about_one_request_in_probe_every_looks_for_company() -> None:
    batches = former(Run())
    offered = sum(batches.probe() for _ in range(10 * PROBE_EVERY))
    assert 6 <= offered <= 10  # every 16-22 requests
