"""Dynamic batching (agent/batching.py) with fake models: coalescing and split-back, the batch
size limit, the queue delay, shape-incompatible requests kept apart, a bad request refused alone,
the governor's switch falling between batches, a runtime error failing every member, metrics per
request, and the server's choice of when to batch at all.

The tests make batches deterministic without timing: the first request's run is held on a gate
(one run slot), the others queue behind it and coalesce, and the test releases the gate once
``BatchFormer.waiting`` shows they all joined."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.batching import BatchFormer, has_batch_axis
from edgesdk.agent.serving import ModelServer

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.schemas.agent_config import BatchingConfig, BatchingSettings
from edgesdk.schemas.manifest import AccuracyResult, TensorSpec, Variant

SHA = "0" * 64


class GatedRun:
    """A ``run_batch``: y = x * factor; the first call waits on ``gate``; every call recorded."""

    def __init__(self, factor: float = 2.0, *, split_rows: bool = True) -> None:
        self.factor = factor
        self.split_rows = split_rows
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[dict[str, np.ndarray]] = []
        self.fail: Exception | None = None

    def __call__(self, feeds: Any) -> tuple[dict[str, np.ndarray], str]:
        first = not self.calls
        self.calls.append(dict(feeds))
        if first:
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        if self.fail is not None and not first:
            raise self.fail
        y = feeds["x"] * self.factor
        if not self.split_rows:
            y = y.sum(axis=0, keepdims=True)  # one row whatever the batch: not splittable
        return {"y": y}, f"call{len(self.calls)}"


def settings(**overrides: Any) -> BatchingSettings:
    # One run slot: a held first run makes the others queue behind it (see the module docstring).
    base = {"enabled": True, "max_batch_size": 8, "max_queue_delay_us": 0, "max_concurrent_batches": 1}
    return BatchingSettings(**{**base, **overrides})


def rows(n: int, value: float, width: int = 4) -> np.ndarray:
    return np.full((n, width), value, np.float32)


def submit_behind_gate(
    batcher: BatchFormer,
    run: GatedRun,
    requests: list[dict[str, np.ndarray]],
    call: Callable[..., Any] | None = None,
) -> tuple[Future[Any], list[Future[Any]]]:
    """Start a first request that holds the run slot, then ``requests``; wait until they all
    wait in filling batches; returns the futures (the gate still closed)."""
    pool = ThreadPoolExecutor(max_workers=len(requests) + 1)
    call = call or batcher.run
    first = pool.submit(call, {"x": rows(1, -1.0)})
    assert run.entered.wait(10)
    futures = [pool.submit(call, feeds) for feeds in requests]
    deadline = time.monotonic() + 10
    while batcher.waiting() < len(requests):
        assert time.monotonic() < deadline, f"only {batcher.waiting()} of {len(requests)} joined"
        time.sleep(0.001)
    pool.shutdown(wait=False)
    return first, futures


def test_requests_queued_behind_a_run_coalesce_and_each_gets_its_own_rows() -> None:
    run = GatedRun()
    batcher = BatchFormer(run, settings())
    requests = [{"x": rows(n, float(i))} for i, n in enumerate([1, 2, 1, 3], start=1)]
    first, futures = submit_behind_gate(batcher, run, requests)
    run.gate.set()
    assert np.array_equal(first.result(10)[0]["y"], rows(1, -2.0))
    results = [f.result(10) for f in futures]
    assert len(run.calls) == 2 and run.calls[1]["x"].shape == (7, 4)  # one run for all four
    for feeds, (outputs, tag) in zip(requests, results):
        assert np.array_equal(outputs["y"], feeds["x"] * 2.0)  # its rows, in its order
        assert tag == "call2"
    assert batcher.batches_run == 1


def test_max_batch_size_is_respected_and_a_full_batch_starts() -> None:
    run = GatedRun()
    batcher = BatchFormer(run, settings(max_batch_size=4))
    requests = [{"x": rows(1, float(i))} for i in range(6)] + [{"x": rows(5, 9.0)}]  # 5 rows: alone
    first, futures = submit_behind_gate(batcher, run, requests[:6])
    run.gate.set()
    for feeds, future in zip(requests, futures):
        assert np.array_equal(future.result(10)[0]["y"], feeds["x"] * 2.0)
    sizes = sorted(call["x"].shape[0] for call in run.calls[1:])
    assert sizes == [2, 4]  # 6 requests of one row, at most 4 rows a batch
    outputs, _ = batcher.run(requests[6])  # larger than max_batch_size: runs alone, as unbatched
    assert run.calls[-1]["x"].shape == (5, 4) and np.array_equal(outputs["y"], rows(5, 18.0))
    first.result(10)


def test_shape_incompatible_requests_are_not_merged() -> None:
    run = GatedRun()
    batcher = BatchFormer(run, settings())
    requests = [
        {"x": rows(1, 1.0)},
        {"x": rows(1, 2.0, width=8)},
        {"x": rows(1, 3.0)},
        {"x": rows(1, 4.0).astype(np.float64)},
        {"x": rows(2, 5.0, width=8)},
    ]
    first, futures = submit_behind_gate(batcher, run, requests)
    run.gate.set()
    for feeds, future in zip(requests, futures):
        y = future.result(10)[0]["y"]
        assert y.dtype == feeds["x"].dtype and np.array_equal(y, feeds["x"] * 2.0)
    batches = sorted((call["x"].shape, call["x"].dtype.name) for call in run.calls[1:])
    assert batches == [((1, 4), "float64"), ((2, 4), "float32"), ((3, 8), "float32")]
    first.result(10)


def test_the_oldest_request_waits_up_to_the_queue_delay_for_company() -> None:
    run = GatedRun()
    run.gate.set()
    # A long delay: the first request waits for the second, and the batch, full, starts at once.
    batcher = BatchFormer(run, settings(max_batch_size=2, max_queue_delay_us=1_000_000))
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(batcher.run, {"x": rows(1, 1.0)})
        while batcher.waiting() < 1:
            time.sleep(0.001)
        b = pool.submit(batcher.run, {"x": rows(1, 2.0)})
        assert np.array_equal(a.result(10)[0]["y"], rows(1, 2.0))
        assert np.array_equal(b.result(10)[0]["y"], rows(1, 4.0))
    assert [call["x"].shape for call in run.calls] == [(2, 4)]
    # A short delay and nobody else: it runs alone once the delay is over.
    alone = BatchFormer(run, settings(max_queue_delay_us=20_000))
    assert np.array_equal(alone.run({"x": rows(1, 3.0)})[0]["y"], rows(1, 6.0))


def test_a_request_on_the_event_loop_never_waits_for_company() -> None:
    run = GatedRun()
    run.gate.set()
    batcher = BatchFormer(run, settings(max_queue_delay_us=1_000_000))  # the 1 s wait would show

    async def on_the_loop() -> float:
        start = time.monotonic()
        batcher.run({"x": rows(1, 1.0)})
        return time.monotonic() - start

    assert asyncio.run(on_the_loop()) < 0.9


def test_a_runtime_error_fails_every_request_of_the_batch() -> None:
    run = GatedRun()
    batcher = BatchFormer(run, settings())
    run.fail = RuntimeBackendError("onnxruntime failed: out of memory")
    first, futures = submit_behind_gate(batcher, run, [{"x": rows(1, float(i))} for i in range(3)])
    run.gate.set()
    first.result(10)  # the gated first call does not fail
    for future in futures:
        with pytest.raises(RuntimeBackendError, match="out of memory"):
            future.result(10)
    assert len(run.calls) == 2


def test_outputs_without_a_row_per_input_row_turn_batching_off_and_answer_each_alone() -> None:
    run = GatedRun(split_rows=False)
    batcher = BatchFormer(run, settings())
    requests = [{"x": rows(1, 1.0)}, {"x": rows(2, 2.0)}]
    first, futures = submit_behind_gate(batcher, run, requests)
    run.gate.set()
    for feeds, future in zip(requests, futures):
        assert np.array_equal(future.result(10)[0]["y"], (feeds["x"] * 2.0).sum(axis=0, keepdims=True))
    assert not batcher.splittable
    calls = len(run.calls)
    batcher.run({"x": rows(1, 1.0)})
    assert len(run.calls) == calls + 1 and run.calls[-1]["x"].shape == (1, 4)
    first.result(10)


def test_has_batch_axis() -> None:
    assert has_batch_axis([("batch", 3)], [("batch", 10)])
    assert has_batch_axis([(None, 3)], [("n", 10)])
    assert not has_batch_axis([(1, 3)], [("batch", 10)])
    assert not has_batch_axis([("batch", 3)], [(1, 10)])
    assert not has_batch_axis([], [])


def test_config_per_model_and_pool_threads() -> None:
    config = BatchingConfig.model_validate(
        {"enabled": False, "models": {"mobilenet": {"enabled": True, "max_batch_size": 4, "max_concurrent_batches": 2}}}
    )
    assert not config.for_model("digits").enabled
    assert config.for_model("mobilenet").max_batch_size == 4
    assert config.pool_threads(4) == 12  # two running batches of 4 and one filling
    assert BatchingConfig().pool_threads(4) == 4  # off: the pool is max_concurrency


# -- through ModelServer -----------------------------------------------------------------------


class FakeModel:
    """A LoadedModel: y = x * factor; ``gate`` holds its first run; every run recorded."""

    def __init__(self, factor: float, shape: list[Any] | None = None) -> None:
        shape = shape or ["batch", 4]
        self.inputs = [TensorSpec(name="x", dtype="float32", shape=shape)]
        self.outputs = [TensorSpec(name="y", dtype="float32", shape=shape)]
        self.thread_safe = True
        self.factor = factor
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.seen: list[np.ndarray] = []
        self.fail: Exception | None = None

    def run(self, feeds: Any) -> dict[str, np.ndarray]:
        self.seen.append(feeds["x"])
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        return {"y": feeds["x"] * np.float32(self.factor)}

    def close(self) -> None:
        pass


def variant(vid: str, precision: str, shape: list[Any]) -> Variant:
    spec = TensorSpec(name="x", dtype="float32", shape=shape)
    return Variant(
        id=vid,
        format="onnx",
        precision=precision,
        runtime="onnxruntime",
        payload=f"{vid}.bin",
        size=1,
        sha256=SHA,
        encrypted_size=1,
        encrypted_sha256=SHA,
        inputs=[spec],
        outputs=[spec.model_copy(update={"name": "y"})],
        accuracy=AccuracyResult(metric="top1", value=1.0, gate=0.98, passed=True, samples=10),
    )


class Recorder:
    def __init__(self) -> None:
        self.observed: list[str] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def observe(self, variant_id: str, seconds: float) -> None:
        with self.lock:
            self.observed.append(variant_id)

    def count_error(self, kind: str) -> None:
        with self.lock:
            self.errors.append(kind)


def batching_server(
    shape: list[Any] | None = None, **batching: Any
) -> tuple[ModelServer, FakeModel, FakeModel, Recorder]:
    shape = shape or ["batch", 4]
    record = Recorder()
    config = BatchingConfig(**{"enabled": True, "max_batch_size": 8, "max_concurrent_batches": 1, **batching})
    server = ModelServer(batching=config, observe=record.observe, count_error=record.count_error)
    fp32, int8 = FakeModel(1.0, shape), FakeModel(2.0, shape)
    server.serve(
        name="m",
        version="1.0.0",
        release=1,
        variants=[(variant("fp32", "fp32", shape), fp32), (variant("int8", "int8", shape), int8)],
    )
    return server, fp32, int8, record


def hold_first_run(server: ModelServer, fp32: FakeModel) -> Future[Any]:
    fp32.gate.clear()
    pool = ThreadPoolExecutor(1)
    first = pool.submit(server.infer_with_variant, "m", {"x": rows(1, -1.0)})
    assert fp32.entered.wait(10)
    pool.shutdown(wait=False)
    return first


def wait_joined(server: ModelServer, count: int) -> None:
    batcher = server.model.former  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while batcher.waiting() < count:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_model_without_a_batch_axis_or_with_batching_off_is_served_one_request_at_a_time() -> None:
    fixed, *_ = batching_server([1, 4])
    assert fixed.model.former is None  # type: ignore[union-attr]
    off = ModelServer()  # the default configuration: a former (for the loop's batches), no pool batches
    off.serve(name="m", version="1", release=1, variants=[(variant("fp32", "fp32", ["b", 4]), FakeModel(1.0))])
    assert not off.model.former.pooled  # type: ignore[union-attr]
    on, *_ = batching_server()
    assert on.model.former.pooled  # type: ignore[union-attr]


def test_a_bad_request_is_refused_alone_and_does_not_poison_the_batch() -> None:
    server, fp32, _, record = batching_server()
    first = hold_first_run(server, fp32)
    pool = ThreadPoolExecutor(4)
    good = [pool.submit(server.infer_with_variant, "m", {"x": rows(1, float(i))}) for i in (1, 2, 3)]
    wait_joined(server, 3)
    bad = np.full((1, 4), 5.0, np.float32)
    bad[0, 2] = np.nan
    with pytest.raises(InferenceInputError, match="NaN or Inf"):
        server.infer_with_variant("m", {"x": bad})  # refused at once: the gate is still closed
    with pytest.raises(InferenceInputError, match="axis 1 must be 4"):
        server.infer_with_variant("m", {"x": rows(1, 1.0, width=5)})
    fp32.gate.set()
    for i, future in zip((1, 2, 3), good):
        outputs, variant_id = future.result(10)
        assert variant_id == "fp32" and np.array_equal(outputs["y"], rows(1, float(i)))
    assert [x.shape[0] for x in fp32.seen] == [1, 3]  # the three good ones ran as one batch
    first.result(10)
    assert record.errors == ["bad_input", "bad_input"]
    assert record.observed == ["fp32"] * 4  # one observation per request, none for the refused
    pool.shutdown()


def test_a_precision_switch_falls_between_batches() -> None:
    server, fp32, int8, _ = batching_server()
    first = hold_first_run(server, fp32)
    pool = ThreadPoolExecutor(3)
    queued = [pool.submit(server.infer_with_variant, "m", {"x": rows(1, float(i))}) for i in (1, 2, 3)]
    wait_joined(server, 3)
    assert server.switch_variant("int8", "test")  # while the fp32 batch runs and three wait
    fp32.gate.set()
    outputs, variant_id = first.result(10)
    assert variant_id == "fp32" and np.array_equal(outputs["y"], rows(1, -1.0))
    for i, future in zip((1, 2, 3), queued):
        outputs, variant_id = future.result(10)
        assert variant_id == "int8" and np.array_equal(outputs["y"], rows(1, 2.0 * i))  # the int8 factor
    assert [x.shape[0] for x in int8.seen] == [3]
    pool.shutdown()


def test_a_runtime_error_in_a_batch_is_counted_for_each_request() -> None:
    server, fp32, _, record = batching_server()
    first = hold_first_run(server, fp32)
    pool = ThreadPoolExecutor(3)
    queued = [pool.submit(server.infer_with_variant, "m", {"x": rows(1, float(i))}) for i in (1, 2, 3)]
    wait_joined(server, 3)
    fp32.fail = RuntimeBackendError("onnxruntime: bad alloc")
    fp32.gate.set()
    with pytest.raises(RuntimeBackendError):
        first.result(10)
    for future in queued:
        with pytest.raises(RuntimeBackendError, match="bad alloc"):
            future.result(10)
    assert record.errors == ["runtime"] * 4 and record.observed == []
    pool.shutdown()
