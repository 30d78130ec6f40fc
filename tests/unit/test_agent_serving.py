"""ModelServer with fake LoadedModels: signature checks, quantization adapters, atomic swaps
and switches (requests in flight finish on the variant they started on), gated variants."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from edgesdk.agent.events import EventBus
from edgesdk.agent.serving import ModelNotFoundError, ModelServer, NoModelError, order_ladder
from edgesdk.agent.tensor_signature import dequantize, quantize

from edgesdk.errors import AgentError, InferenceInputError
from edgesdk.profiles import get_profile
from edgesdk.schemas.manifest import AccuracyResult, QuantParams, TensorSpec, Variant

SHA = "0" * 64


class FakeModel:
    """y = x * factor (+ records which thread ran); optionally waits on a gate."""

    def __init__(
        self, factor: float, *, dtype: str = "float32", quant: QuantParams | None = None, thread_safe: bool = True
    ):
        self.factor = factor
        self.inputs = [TensorSpec(name="x", dtype=dtype, shape=["batch", 4], quantization=quant)]
        self.outputs = [TensorSpec(name="y", dtype=dtype, shape=["batch", 4], quantization=quant)]
        self.thread_safe = thread_safe
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.seen: list[np.ndarray] = []
        self.concurrent = 0
        self.max_concurrent = 0

    def run(self, feeds):
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        x = feeds["x"]
        self.seen.append(x)
        self.concurrent -= 1
        return {"y": (x.astype(np.float32) * self.factor).astype(x.dtype)}

    def close(self) -> None:
        pass


def variant(
    vid: str, precision: str, *, passed: bool | None = True, runtime: str = "onnxruntime", fmt: str = "onnx"
) -> Variant:
    spec = TensorSpec(name="x", dtype="float32", shape=["batch", 4])
    out = TensorSpec(name="y", dtype="float32", shape=["batch", 4])
    accuracy = (
        None
        if passed is None
        else AccuracyResult(metric="top1", value=1.0 if passed else 0.5, gate=0.98, passed=passed, samples=10)
    )
    return Variant(
        id=vid,
        format=fmt,
        precision=precision,
        runtime=runtime,
        payload=f"{vid}.bin",
        size=1,
        sha256=SHA,
        encrypted_size=1,
        encrypted_sha256=SHA,
        inputs=[spec],
        outputs=[out],
        accuracy=accuracy,
    )


def serve_two(server: ModelServer) -> tuple[FakeModel, FakeModel]:
    fp32, int8 = FakeModel(1.0), FakeModel(2.0)
    server.serve(
        name="m",
        version="1.0.0",
        release=1,
        variants=[(variant("fp32", "fp32"), fp32), (variant("int8", "int8"), int8)],
    )
    return fp32, int8


def x(n: int = 1) -> np.ndarray:
    return np.ones((n, 4), np.float32)


def test_infer_runs_the_active_variant_and_checks_the_signature() -> None:
    server = ModelServer()
    serve_two(server)
    assert server.infer("m", {"x": x(3)})["y"].shape == (3, 4)
    with pytest.raises(InferenceInputError, match="dtype float64, expected float32"):
        server.infer("m", {"x": x().astype(np.float64)})
    with pytest.raises(InferenceInputError, match="rank 1"):
        server.infer("m", {"x": np.ones(4, np.float32)})
    with pytest.raises(InferenceInputError, match="axis 1 must be 4"):
        server.infer("m", {"x": np.ones((1, 5), np.float32)})
    with pytest.raises(InferenceInputError, match=r"missing input\(s\) \['x'\]"):
        server.infer("m", {})
    with pytest.raises(InferenceInputError, match=r"unknown input\(s\) \['z'\]"):
        server.infer("m", {"x": x(), "z": x()})
    with pytest.raises(InferenceInputError, match="NaN or Inf"):
        server.infer("m", {"x": np.full((1, 4), np.nan, np.float32)})
    with pytest.raises(InferenceInputError, match="empty"):
        server.infer("m", {"x": np.ones((0, 4), np.float32)})
    with pytest.raises(ModelNotFoundError, match="'other' is not served"):
        server.infer("other", {"x": x()})


def test_nonfinite_allowed_when_configured() -> None:
    server = ModelServer(allow_nonfinite=True)
    serve_two(server)
    assert np.isinf(server.infer("m", {"x": np.full((1, 4), np.inf, np.float32)})["y"]).all()


def test_no_model_yet() -> None:
    with pytest.raises(NoModelError, match="no model is loaded"):
        ModelServer().infer("m", {"x": x()})
    assert ModelServer().running_model() is None


def test_switch_variant_is_counted_and_emitted() -> None:
    events = EventBus()
    seen = []
    events.subscribe(lambda name, detail: seen.append((name, detail)))
    server = ModelServer(events=events)
    serve_two(server)
    assert server.switch_variant("int8", "too hot") is True
    assert server.switch_variant("int8", "again") is False
    assert server.infer("m", {"x": x()})["y"][0, 0] == 2.0
    assert server.switch_count == 1
    switch = [d for n, d in seen if n == "precision_switch"]
    assert switch == [
        {
            "from": "fp32",
            "to": "int8",
            "from_precision": "fp32",
            "to_precision": "int8",
            "reason": "too hot",
            "switch_count": 1,
        }
    ]
    with pytest.raises(AgentError, match="'fp16' is not loaded"):
        server.switch_variant("fp16", "x")


def test_in_flight_request_finishes_on_the_old_variant() -> None:
    server = ModelServer()
    fp32, _ = serve_two(server)
    fp32.gate = threading.Event()
    result = {}
    # One request blocked inside fp32 while we switch variant, then swap the whole model.
    t = threading.Thread(target=lambda: result.setdefault("first", server.infer_with_variant("m", {"x": x()})))
    t.start()
    assert fp32.entered.wait(5)
    server.switch_variant("int8", "hot")
    assert server.infer_with_variant("m", {"x": x()})[1] == "int8"  # new requests: new variant
    new = FakeModel(10.0)
    server.serve(name="m", version="2.0.0", release=2, variants=[(variant("fp32", "fp32"), new)])
    assert server.infer("m", {"x": x()})["y"][0, 0] == 10.0
    fp32.gate.set()
    t.join(5)
    outputs, used = result["first"]
    assert used == "fp32" and outputs["y"][0, 0] == 1.0


def test_non_thread_safe_models_run_one_at_a_time() -> None:
    server = ModelServer()
    model = FakeModel(1.0, thread_safe=False)
    server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), model)])
    threads = [threading.Thread(target=lambda: [server.infer("m", {"x": x()}) for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert model.max_concurrent == 1


def test_quantized_variant_takes_and_returns_float() -> None:
    quant = QuantParams(scale=[0.5], zero_point=[3])
    int8 = FakeModel(1.0, dtype="int8", quant=quant)
    server = ModelServer()
    server.serve(
        name="m",
        version="1.0.0",
        release=1,
        variants=[(variant("fp32", "fp32"), FakeModel(1.0)), (variant("int8", "int8"), int8)],
    )
    server.switch_variant("int8", "test")
    out = server.infer("m", {"x": np.array([[1.0, -1.0, 2.0, 100.0]], np.float32)})["y"]
    assert int8.seen[-1].dtype == np.int8
    assert int8.seen[-1].tolist() == [[5, 1, 7, 127]]  # round(x/0.5)+3, clipped
    np.testing.assert_allclose(out, [[1.0, -1.0, 2.0, 62.0]])
    assert out.dtype == np.float32


def test_quantize_per_channel_round_trip() -> None:
    spec = TensorSpec(
        name="t", dtype="uint8", shape=[2, 3], quantization=QuantParams(scale=[0.1, 1.0], zero_point=[0, 10], axis=0)
    )
    values = np.array([[0.0, 0.5, 1.0], [-5.0, 0.0, 5.0]], np.float32)
    q = quantize(values, spec)
    assert q.dtype == np.uint8
    np.testing.assert_allclose(dequantize(q, spec), values, atol=0.05)


def test_ladder_order_gate_and_profile() -> None:
    profile = get_profile("rpi5-8gb")  # litert first, then onnxruntime, then openvino
    variants = [
        variant("onnx-int8", "int8"),
        variant("onnx-fp32", "fp32"),
        variant("tflite-fp32", "fp32", runtime="litert", fmt="tflite"),
        variant("coreml-fp16", "fp16", runtime="coreml", fmt="coreml"),
    ]
    groups = order_ladder(variants, profile)
    assert [[v.id for v in g] for g in groups] == [["tflite-fp32", "onnx-fp32"], ["onnx-int8"]]


def test_swap_loads_only_gated_variants_and_keeps_serving_on_failure(monkeypatch) -> None:
    import edgesdk.runtimes as runtimes

    loaded: list[str] = []

    def fake_load_variant(runtime, files, options=None, execution=None):
        loaded.append(files["model.onnx"].decode())
        if files["model.onnx"] == b"bad":
            from edgesdk.errors import RuntimeBackendError

            raise RuntimeBackendError("cannot parse")
        return FakeModel(1.0)

    monkeypatch.setattr(runtimes, "load_variant", fake_load_variant)
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=1),
        variants=[variant("fp32", "fp32"), variant("fp16", "fp16", passed=False), variant("int8", "int8", passed=None)],
    )
    bundle = SimpleNamespace(manifest=manifest, sha256="b" * 64)
    contents = {"fp32": b"fp32", "fp16": b"fp16", "int8": b"int8"}
    server = ModelServer(profile=get_profile("rpi5-8gb"))
    model = server.swap(bundle, "key", decrypt=lambda b, vid, key: {"model.onnx": contents[vid]})
    assert [v.id for v in model.ladder] == ["fp32", "int8"]  # fp16 failed its gate: never loaded
    assert loaded == ["fp32", "int8"]
    # A bundle whose variants all fail to load leaves the old model serving.
    contents.update(fp32=b"bad", int8=b"bad")
    manifest.model = SimpleNamespace(name="m", version="2.0.0", release=2)
    with pytest.raises(AgentError, match="no variant of m 2.0.0 could be loaded"):
        server.swap(bundle, "key", decrypt=lambda b, vid, key: {"model.onnx": contents[vid]})
    assert server.running_model().version == "1.0.0"


def test_all_finite_fast_path_agrees_with_the_exact_check() -> None:
    from edgesdk.agent.nonfinite import all_finite

    rng = np.random.default_rng(0)
    big = rng.standard_normal((3, 224, 224)).astype(np.float32)
    assert all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        copy = big.copy()
        copy[1, 100, 7] = bad
        assert not all_finite(copy)
    huge = np.full(10000, 3e38, np.float32)  # x·x overflows, yet every value is finite
    assert all_finite(huge)
    assert not all_finite(np.asfortranarray(np.full((100, 100), np.nan)))
    assert all_finite(np.ones(8, np.float16)) and not all_finite(np.array([np.nan], np.float16))


def test_a_damaged_bundle_is_not_served_in_part(monkeypatch) -> None:
    # A variant whose bytes fail authentication means the bundle changed on disk: the swap is
    # abandoned (the caller falls back to the last good slot) rather than serving the rest.
    import edgesdk.runtimes as runtimes
    from edgesdk.errors import IntegrityError

    made: list[FakeModel] = []

    def fake_load_variant(runtime, files, options=None, execution=None):
        made.append(FakeModel(1.0))
        made[-1].closed = False
        made[-1].close = lambda model=made[-1]: setattr(model, "closed", True)
        return made[-1]

    def decrypt(bundle, variant_id, key):
        if variant_id == "int8":
            raise IntegrityError("payload 'int8.enc': segment 0 failed authentication")
        return {"model.onnx": variant_id.encode()}

    monkeypatch.setattr(runtimes, "load_variant", fake_load_variant)
    server = ModelServer(profile=get_profile("rpi5-8gb"))
    old = server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), FakeModel(2.0))])
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="2.0.0", release=2),
        variants=[variant("fp32", "fp32"), variant("int8", "int8")],
    )
    with pytest.raises(IntegrityError, match="int8: payload 'int8.enc': segment 0 failed authentication"):
        server.swap(SimpleNamespace(manifest=manifest, sha256="c" * 64), "key", decrypt=decrypt)
    assert server.model is old
    assert len(made) == 1 and made[0].closed  # the fp32 variant it had loaded is released


def test_fully_fixed_shape_takes_the_one_comparison_path_and_still_checks_everything() -> None:
    from edgesdk.agent.tensor_signature import Signature, TensorSlot

    slot = TensorSlot("image", np.dtype("float32"), (1, 3, 64, 64))
    signature = Signature([slot], [], allow_nonfinite=False)
    image = np.zeros((1, 3, 64, 64), np.float32)
    signature.check({"image": image})
    signature.check({"image": np.zeros((1, 3, 64, 64), np.dtype("<f4"))})  # equal, maybe not identical
    with pytest.raises(InferenceInputError, match="rank 3"):
        signature.check({"image": np.zeros((3, 64, 64), np.float32)})
    with pytest.raises(InferenceInputError, match="axis 2 must be 64"):
        signature.check({"image": np.zeros((1, 3, 63, 64), np.float32)})
    with pytest.raises(InferenceInputError, match="dtype float64"):
        signature.check({"image": image.astype(np.float64)})
    with pytest.raises(InferenceInputError, match=r"dtype float32 \(>f4, non-native byte order\)"):
        signature.check({"image": image.astype(">f4")})
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = image.copy()
        poisoned[0, 2, 63, 63] = bad
        with pytest.raises(InferenceInputError, match="NaN or Inf"):
            signature.check({"image": poisoned})
    signature.allow_nonfinite = True
    signature.check({"image": poisoned})
    # A zero-size axis in the signature is not "fully fixed": the empty check still answers.
    empty = Signature([TensorSlot("x", np.dtype("float32"), (0, 4))], [], allow_nonfinite=False)
    with pytest.raises(InferenceInputError, match="empty"):
        empty.check({"x": np.zeros((0, 4), np.float32)})


def test_only_variants_that_need_no_adapting_get_the_checked_feeds_as_they_are() -> None:
    fp32, fp16 = FakeModel(1.0), FakeModel(2.0, dtype="float16")
    locked = FakeModel(3.0, thread_safe=False)
    server = ModelServer()
    server.serve(
        name="m",
        version="1.0.0",
        release=1,
        variants=[(variant("fp32", "fp32"), fp32), (variant("fp16", "fp16"), fp16), (variant("int8", "int8"), locked)],
    )
    plain, half, serial = server.model.ladder
    assert (plain.takes_public_feeds, half.takes_public_feeds, serial.takes_public_feeds) == (True, False, False)
    feeds = {"x": x()}
    server.infer("m", feeds)
    assert fp32.seen[-1] is feeds["x"]
    server.switch_variant("fp16", "test")
    server.infer("m", feeds)
    assert fp16.seen[-1].dtype == np.float16  # adapted to what this variant takes
    server.switch_variant("int8", "test")
    server.infer("m", feeds)
    assert locked.seen[-1] is feeds["x"]  # no adapting needed, but it still ran under its lock


def test_size_only_and_unvalidated_variants_are_not_governor_steps(monkeypatch) -> None:
    # The converter marks an int8 slower than its fp32 "size-only" and a Core ML variant that
    # never ran "off": the agent loads neither onto the ladder while a speed step exists.
    import edgesdk.runtimes as runtimes

    monkeypatch.setattr(runtimes, "load_variant", lambda runtime, files, options=None, execution=None: FakeModel(1.0))
    roles = {"fp32": "reference", "fp16": "speed", "int8": "size-only"}
    variants = [variant(v, v).model_copy(update={"ladder_role": r}) for v, r in roles.items()]
    off = variant("coreml-fp16", "fp16", passed=None, runtime="coreml", fmt="coreml")
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=1),
        variants=[*variants, off.model_copy(update={"ladder_role": "off"})],
    )
    server = ModelServer(profile=get_profile("rpi5-8gb"))
    model = server.swap(SimpleNamespace(manifest=manifest, sha256="d" * 64), "key", decrypt=lambda b, v, k: {"m": b""})
    assert [v.id for v in model.ladder] == ["fp32", "fp16"]
    # With nothing but size steps left (an older agent's fp32 missing), the size step still serves.
    only = SimpleNamespace(model=SimpleNamespace(name="m", version="1.0.1", release=2), variants=[variants[2]])
    model = server.swap(SimpleNamespace(manifest=only, sha256="e" * 64), "key", decrypt=lambda b, v, k: {"m": b""})
    assert [v.id for v in model.ladder] == ["int8"]
