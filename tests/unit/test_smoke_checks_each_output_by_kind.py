"""The install's golden check judges every output by its own kind (edgesdk.quality), on a real
bundle run in onnxruntime: a landmark output that drifts is refused by name even when the
classifier beside it holds (the old one-metric check read top-1 over every output, and a
shifted landmark keeps its argmax)."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from tests.bundle_helpers import make_keys

pytest.importorskip("onnxruntime", reason="the bundle's variant runs in onnxruntime (edgesdk[onnx])")
onnx = pytest.importorskip("onnx", reason="the two-output model is built with onnx")

from edgesdk.agent.ota.smoke import SmokeTestError, smoke_test  # noqa: E402

from edgesdk.bundle import decrypt_golden, decrypt_variant, package_bundle, verify_bundle  # noqa: E402
from edgesdk.schemas.manifest import AccuracyResult, TensorSpec  # noqa: E402
from edgesdk.schemas.report import ConversionReport, ShippedVariant  # noqa: E402

RNG = np.random.default_rng(3)
W_LOGITS = RNG.normal(size=(8, 10)).astype(np.float32)
W_LANDMARKS = (RNG.normal(size=(8, 6)) * 20).astype(np.float32)


def _two_output_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wl"], ["logits"]), helper.make_node("MatMul", ["x", "wm"], ["landmarks"])],
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10]),
            helper.make_tensor_value_info("landmarks", TensorProto.FLOAT, ["batch", 6]),
        ],
        [numpy_helper.from_array(W_LOGITS, "wl"), numpy_helper.from_array(W_LANDMARKS, "wm")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _bundle(tmp_path: Path, landmark_shift: float) -> tuple[object, object]:
    keys = make_keys(tmp_path / "keys")
    out = tmp_path / "convert"
    (out / "artifacts" / "onnx-fp32").mkdir(parents=True)
    model = _two_output_model()
    (out / "artifacts" / "onnx-fp32" / "model.onnx").write_bytes(model)
    x = RNG.normal(size=(6, 8)).astype(np.float32)
    landmarks = x @ W_LANDMARKS
    landmarks[2] += landmark_shift  # one sample's points moved together: argmax unchanged
    buffer = io.BytesIO()
    np.savez(buffer, x=x, **{"output:logits": x @ W_LOGITS, "output:landmarks": landmarks})
    (out / "golden.npz").write_bytes(buffer.getvalue())
    accuracy = AccuracyResult(
        metric="top1", value=1.0, gate=0.98, passed=True, samples=6, max_abs_diff={"logits": 0.0, "landmarks": 0.0}
    )
    variant = ShippedVariant(
        id="onnx-fp32",
        format="onnx",  # type: ignore[arg-type]
        precision="fp32",  # type: ignore[arg-type]
        runtime="onnxruntime",  # type: ignore[arg-type]
        files=["artifacts/onnx-fp32/model.onnx"],
        size=len(model),
        inputs=[TensorSpec(name="x", dtype="float32", shape=["batch", 8])],
        outputs=[
            TensorSpec(name="logits", dtype="float32", shape=["batch", 10]),
            TensorSpec(name="landmarks", dtype="float32", shape=["batch", 6]),
        ],
        accuracy=accuracy,
    )
    report = ConversionReport(
        model_name="hands",
        source="tests",
        profile="rpi5-8gb",
        created=datetime.now(timezone.utc),
        metric="top1",
        gate=0.98,
        variants=[variant],
        golden="golden.npz",
    )
    (out / "report.json").write_text(report.model_dump_json(indent=2))
    path = package_bundle(
        out, name="hands", version="1.0.0", publisher_key=keys.publisher_key, recipients=[keys.device_pub],
        out=tmp_path / "hands.edgepkg",
    )  # fmt: skip
    verified = verify_bundle(path, trusted_publishers=[keys.publisher_pub], profile="rpi5-8gb")
    return verified, keys.device()


def _install_check(verified: object, device_key: object) -> object:
    return smoke_test(
        verified, lambda v, vid: decrypt_variant(v, vid, device_key), decrypt_golden(verified, device_key)
    )  # type: ignore[arg-type]


def test_the_install_refuses_a_drifting_second_output_by_name(tmp_path: Path) -> None:
    verified, device_key = _bundle(tmp_path, landmark_shift=5.0)
    with pytest.raises(SmokeTestError, match=r"output landmarks: abs 5 .*: fail against the golden"):
        _install_check(verified, device_key)


def test_the_install_passes_when_every_output_reproduces_its_golden(tmp_path: Path) -> None:
    verified, device_key = _bundle(tmp_path, landmark_shift=0.0)
    assert _install_check(verified, device_key).passed == {"onnx-fp32": 1.0}


def test_a_nan_sample_is_the_worst_of_a_tail_not_skipped() -> None:
    from edgesdk.quality.tail_statistics import tail_reading

    errors = np.array([0.1, np.nan, 0.2])
    assert tail_reading(errors, 1.0, lower_is_better=True).verdict == "fail"
    assert tail_reading(np.array([0.999, np.nan, 0.998]), 0.99).verdict == "fail"


def test_an_output_with_nan_where_the_golden_has_numbers_is_refused() -> None:
    from types import SimpleNamespace

    from edgesdk.agent.ota.smoke import check_outputs

    meta = SimpleNamespace(id="onnx-int8", accuracy=None)
    manifest = SimpleNamespace(golden=SimpleNamespace(metric="top1", gate=0.98))
    want = np.array([[0.1, 0.9, 0.0], [0.7, 0.2, 0.1]])
    got = want.copy()
    got[1, 2] = np.nan  # argmax of the row would still be 0: top-1 alone would agree
    with pytest.raises(SmokeTestError, match="output 'scores' holds NaN or Inf"):
        check_outputs(meta, {"scores": got}, {"scores": want}, manifest)  # type: ignore[arg-type]
