"""The NaN/Inf scan of large float inputs, run on the scan thread while the model runs.

Inputs of DEFERRED_SCAN_MIN_BYTES or more are scanned concurrently with the model's run when
the run leaves a core free (``LoadedModel.cores_free_while_running``), else before it; the
request must end exactly as if they had been scanned first: the same InferenceInputError,
counted as bad_input, never the outputs of a bad input. Everything else (names, dtypes, shapes,
small inputs) is still refused before the model runs.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from edgesdk.agent import nonfinite as nonfinite_module
from edgesdk.agent.nonfinite import ScanThread
from edgesdk.agent.serving import ModelServer
from edgesdk.agent.tensor_signature import DEFERRED_SCAN_MIN_BYTES, Signature, TensorSlot

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.schemas.manifest import QuantParams, TensorSpec, Variant
from tests.unit.test_agent_serving import variant

SHA = "0" * 64
ROWS = DEFERRED_SCAN_MIN_BYTES // 16  # (ROWS, 4) float32 is exactly the threshold: deferred
NAN_MESSAGE = r"input 'x': contains NaN or Inf \(refused: the agent's api.allow_nonfinite is false\)"


class RecordingModel:
    """y = x * 2; counts its runs (without keeping the inputs); can fail or take its time."""

    thread_safe = True
    # Its run sleeps (as one on an accelerator waits): the scan may use the idle core meanwhile.
    cores_free_while_running = True

    def __init__(self, *, dtype: str = "float32", quant: QuantParams | None = None, delay: float = 0.005) -> None:
        self.inputs = [TensorSpec(name="x", dtype=dtype, shape=["batch", 4], quantization=quant)]
        self.outputs = [TensorSpec(name="y", dtype=dtype, shape=["batch", 4], quantization=quant)]
        self.runs = 0
        self.fail: Exception | None = None
        # Longer than the scan thread's poll (SCAN_POLL_S): the scan usually runs over there
        # during the run, as with a real model. With 0 the request mostly scans its job itself.
        self.delay = delay

    def run(self, feeds):
        self.runs += 1
        if self.delay:
            time.sleep(self.delay)  # releases the GIL, as onnxruntime does while it runs
        if self.fail is not None:
            raise self.fail
        x = feeds["x"]
        return {"y": (x * 2).astype(x.dtype)}

    def close(self) -> None:
        pass


def serve(model: RecordingModel, **options) -> tuple[ModelServer, list[str]]:
    errors: list[str] = []
    server = ModelServer(count_error=errors.append, **options)
    server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32", passed=None), model)])
    return server, errors


def big(value: float = 1.0, rows: int = ROWS) -> np.ndarray:
    return np.full((rows, 4), value, np.float32)


class NoScans:
    """A ScanThread stand-in that fails the test if anything is handed to it."""

    def submit(self, inputs):
        raise AssertionError(f"nothing should be deferred here: {[name for name, _ in inputs]}")


@pytest.mark.parametrize(
    "bad, where",
    [(np.nan, (ROWS // 2, 1)), (np.inf, (ROWS // 3, 2)), (-np.inf, (0, 0)), (np.nan, (ROWS - 1, 3))],
    ids=["nan-middle", "inf", "minus-inf-first", "nan-last-element"],
)
def test_a_large_input_with_one_nonfinite_value_is_refused_and_counted(bad, where) -> None:
    model = RecordingModel()
    server, errors = serve(model)
    x = big()
    x[where] = bad
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": x})
    assert errors == ["bad_input"]
    assert model.runs == 1  # it was scanned during the run, not before it


def test_a_large_finite_input_is_served() -> None:
    model = RecordingModel()
    server, errors = serve(model)
    x = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    outputs, variant_id = server.infer_with_variant("m", {"x": x})
    np.testing.assert_array_equal(outputs["y"], x * 2)
    assert variant_id == "fp32" and errors == [] and model.runs == 1


def test_inputs_below_the_threshold_are_still_scanned_before_the_run() -> None:
    model = RecordingModel()
    server, errors = serve(model)
    server.scans = NoScans()  # type: ignore[assignment]
    x = big(rows=ROWS - 1)
    x[-1, -1] = np.nan
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": x})
    assert model.runs == 0 and errors == ["bad_input"]


class BusyCoresModel(RecordingModel):
    """A runtime whose threads take every core while it runs (onnxruntime's default)."""

    cores_free_while_running = False


class UnsaidModel:
    """A LoadedModel from a backend that predates ``cores_free_while_running``: no such attribute."""

    thread_safe = True

    def __init__(self) -> None:
        self.recording = RecordingModel()
        self.inputs, self.outputs = self.recording.inputs, self.recording.outputs

    @property
    def runs(self) -> int:
        return self.recording.runs

    def run(self, feeds):
        return self.recording.run(feeds)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("model_class", [BusyCoresModel, UnsaidModel], ids=["says-no-free-core", "says-nothing"])
def test_large_inputs_are_scanned_before_the_run_when_it_leaves_no_core_free(model_class) -> None:
    model = model_class()
    assert getattr(model, "cores_free_while_running", False) is False
    server, errors = serve(model)
    server.scans = NoScans()  # type: ignore[assignment]
    x = big()
    x[ROWS // 2, 1] = np.nan
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": x})
    assert model.runs == 0 and errors == ["bad_input"]
    outputs = server.infer("m", {"x": big(2.0)})
    np.testing.assert_array_equal(outputs["y"], big(4.0))


def test_shape_and_dtype_errors_on_a_large_input_are_raised_before_the_model_runs() -> None:
    model = RecordingModel()
    server, errors = serve(model)
    wide = np.full((ROWS, 5), np.nan, np.float32)
    with pytest.raises(InferenceInputError, match="axis 1 must be 4"):
        server.infer("m", {"x": wide})
    with pytest.raises(InferenceInputError, match="rank 3"):
        server.infer("m", {"x": np.full((ROWS, 4, 1), np.nan, np.float32)})
    with pytest.raises(InferenceInputError, match="dtype float64, expected float32"):
        server.infer("m", {"x": np.full((ROWS, 4), np.nan, np.float64)})
    with pytest.raises(InferenceInputError, match=r"unknown input\(s\) \['z'\]"):
        server.infer("m", {"x": big(np.nan), "z": big()})
    assert model.runs == 0
    assert errors == ["bad_input"] * 4


@pytest.mark.parametrize("delay", [0.0, 0.002], ids=["instant-model", "2ms-model"])
def test_concurrent_requests_each_get_their_own_answer(delay) -> None:
    model = RecordingModel(delay=delay)
    server, errors = serve(model)
    failures: list[str] = []
    refused = 0
    count_lock = threading.Lock()

    def client(k: int) -> None:
        nonlocal refused
        rng = np.random.default_rng(k)
        for i in range(12):
            x = big(float(k * 100 + i))
            poisoned = bool(rng.integers(2))
            if poisoned:
                x[tuple(rng.integers((ROWS, 4)))] = rng.choice([np.nan, np.inf, -np.inf])
            try:
                y = server.infer("m", {"x": x})["y"]
            except InferenceInputError as exc:
                if not poisoned or "NaN or Inf" not in str(exc):
                    failures.append(f"client {k} request {i}: refused: {exc}")
                with count_lock:
                    refused += 1
                continue
            if poisoned:
                failures.append(f"client {k} request {i}: NaN/Inf input served")
            elif not (y == 2 * (k * 100 + i)).all():
                failures.append(f"client {k} request {i}: someone else's outputs")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert 0 < refused < 8 * 12
    assert errors == ["bad_input"] * refused


def test_allow_nonfinite_skips_the_scan_and_can_be_toggled_per_call() -> None:
    model = RecordingModel()
    server, errors = serve(model, allow_nonfinite=True)
    real_scans = server.scans
    server.scans = NoScans()  # type: ignore[assignment]
    assert np.isnan(server.infer("m", {"x": big(np.nan)})["y"]).all()
    # The benchmark flips the flag between calls: the next request is scanned again.
    signature = server.model.signature
    signature.allow_nonfinite = False
    server.scans = real_scans
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": big(np.nan)})
    signature.allow_nonfinite = True
    server.scans = NoScans()  # type: ignore[assignment]
    server.infer("m", {"x": big(np.inf)})
    assert errors == ["bad_input"] and model.runs == 3


def test_a_bad_input_wins_over_the_runtime_error_it_caused() -> None:
    model = RecordingModel()
    server, errors = serve(model)
    model.fail = RuntimeBackendError("onnxruntime: invalid value in node 'Conv_0'")
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": big(np.nan)})
    assert errors == ["bad_input"]
    with pytest.raises(RuntimeBackendError, match="Conv_0"):  # a finite input: the runtime's own error
        server.infer("m", {"x": big()})
    assert errors == ["bad_input", "runtime"]
    model.fail = InferenceInputError("the runtime refused it")
    with pytest.raises(InferenceInputError, match="the runtime refused it"):
        server.infer("m", {"x": big()})
    assert errors == ["bad_input", "runtime", "bad_input"]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_an_int8_variant_quantizing_a_nan_input_still_reports_the_nan() -> None:
    quant = QuantParams(scale=[0.5], zero_point=[3])
    int8 = RecordingModel(dtype="int8", quant=quant)
    errors: list[str] = []
    server = ModelServer(count_error=errors.append)
    server.serve(
        name="m",
        version="1.0.0",
        release=1,
        variants=[
            (variant("fp32", "fp32", passed=None), RecordingModel()),
            (variant("int8", "int8", passed=None), int8),
        ],
    )
    server.switch_variant("int8", "test")
    x = big(0.5)
    assert server.infer("m", {"x": x})["y"].dtype == np.float32  # quantized in, dequantized out
    x[7, 1] = np.nan
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": x})
    assert errors == ["bad_input"] and int8.runs == 2


class WaitsForTheScan(RecordingModel):
    """Its run lasts until the scan thread has taken the request's job (10 s at most), so the
    scan runs over there whatever the machine's speed (a fixed sleep lost that race under QEMU,
    where the thread's first pick-up came after the run had ended)."""

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.scan_started = threading.Event()

    def run(self, feeds):
        assert self.scan_started.wait(10), "the scan thread never took the job"
        self.scan_started.clear()
        return super().run(feeds)


def test_a_slow_scan_holds_the_result_back(monkeypatch) -> None:
    # The scan thread takes the job during the run, and its scan takes 100 ms more: the request
    # must wait for it, and refuse the input it finds bad.
    real = nonfinite_module.first_nonfinite
    scanned_on: list[str] = []
    model = WaitsForTheScan()

    def slow(inputs):
        scanned_on.append(threading.current_thread().name)
        model.scan_started.set()
        time.sleep(0.1)
        return real(inputs)

    monkeypatch.setattr(nonfinite_module, "first_nonfinite", slow)
    server, errors = serve(model)
    server.scans = ScanThread()
    start = time.perf_counter()
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": big(np.nan)})
    assert server.infer("m", {"x": big()})["y"].shape == (ROWS, 4)
    assert time.perf_counter() - start >= 0.2
    assert scanned_on == ["edgesdk-nan-scan"] * 2
    assert errors == ["bad_input"] and model.runs == 2


def test_without_a_scan_thread_the_scan_runs_first_in_the_request_thread(monkeypatch) -> None:
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    model = RecordingModel()
    server, errors = serve(model)
    server.scans = ScanThread()
    with pytest.raises(InferenceInputError, match=NAN_MESSAGE):
        server.infer("m", {"x": big(np.nan)})
    assert model.runs == 0 and errors == ["bad_input"]  # refused before the run, as before
    assert server.infer("m", {"x": big()})["y"].shape == (ROWS, 4)


def test_the_scan_thread_sleeps_when_idle_and_is_woken_by_the_next_job(monkeypatch) -> None:
    monkeypatch.setattr(nonfinite_module, "SCAN_IDLE_S", 0.01)
    scans = ScanThread()
    inputs = [("a", big()), ("b", big())]
    assert scans.result(scans.submit(inputs)) is None
    deadline = time.monotonic() + 5
    while not scans._idle and time.monotonic() < deadline:
        time.sleep(0.005)
    assert scans._idle  # blocked until woken
    inputs[1][1][-1, -1] = np.inf
    job = scans.submit(inputs)
    while job.done.locked() and time.monotonic() < deadline:  # let the thread do it (no stealing)
        time.sleep(0.005)
    assert not job.done.locked()
    assert scans.result(job) == "b"


def test_a_job_not_picked_up_yet_is_scanned_by_the_request_itself() -> None:
    scans = ScanThread()
    scans._thread = threading.current_thread()  # a thread that never picks anything up
    job = scans.submit([("x", big(np.nan))])
    assert job is not None and scans.result(job) == "x" and not scans._jobs


def test_signature_check_stays_complete_and_the_deferring_variant_returns_the_large_inputs() -> None:
    slots = [TensorSlot("image", np.dtype("float32"), (1, 3, 224, 224)), TensorSlot("small", np.dtype("float32"), (4,))]
    signature = Signature(slots, [], allow_nonfinite=False)
    image = np.zeros((1, 3, 224, 224), np.float32)
    small = np.zeros(4, np.float32)
    assert signature.check_deferring_scans({"image": image, "small": small}) == [("image", image)]
    image[0, 2, 223, 223] = np.nan
    with pytest.raises(InferenceInputError, match="input 'image': contains NaN or Inf"):
        signature.check({"image": image, "small": small})
    deferred = signature.check_deferring_scans({"image": image, "small": small})
    assert deferred is not None and [name for name, _ in deferred] == ["image"]
    small[0] = np.inf  # small inputs are scanned right there
    with pytest.raises(InferenceInputError, match="input 'small': contains NaN or Inf"):
        signature.check_deferring_scans({"image": image, "small": small})
    signature.allow_nonfinite = True
    assert signature.check_deferring_scans({"image": image, "small": small}) is None
    signature.check({"image": image, "small": small})


def test_a_real_onnxruntime_model_with_a_large_input() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from edgesdk.runtimes import load_model

    graph = helper.make_graph(
        [helper.make_node("Mul", ["image", "two"], ["out"])],
        "double",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    loaded = load_model("onnxruntime", proto.SerializeToString(), options={"intra_op_num_threads": "1"})
    meta = Variant(
        id="onnx-fp32",
        format="onnx",
        precision="fp32",
        runtime="onnxruntime",
        payload="onnx-fp32",
        size=1,
        sha256=SHA,
        encrypted_size=1,
        encrypted_sha256=SHA,
        inputs=loaded.inputs,
        outputs=loaded.outputs,
    )
    errors: list[str] = []
    server = ModelServer(count_error=errors.append)
    server.serve(name="double", version="1.0.0", release=1, variants=[(meta, loaded)])
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    assert image.nbytes >= DEFERRED_SCAN_MIN_BYTES
    for _ in range(3):
        np.testing.assert_array_equal(server.infer("double", {"image": image})["out"], image * 2)
    for bad in (np.nan, np.inf):
        poisoned = image.copy()
        poisoned[0, 2, 223, 223] = bad
        with pytest.raises(InferenceInputError, match="input 'image': contains NaN or Inf"):
            server.infer("double", {"image": poisoned})
    with pytest.raises(InferenceInputError, match="axis 3 must be 224"):
        server.infer("double", {"image": np.zeros((1, 3, 224, 225), np.float32)})
    assert errors == ["bad_input"] * 3
