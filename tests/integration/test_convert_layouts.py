"""``edgesdk convert`` on a stateful VAD-shaped ONNX model whose data keeps the model's own layout:
a 0-d sample rate, a state batched on axis 1, per-sample values for a 0-d input — and the three
failures the issue found (a raw IndexError, a self-contradicting message, onnxruntime's
multi-line error) each as one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.schemas.report import ConversionReport
from tests.conftest import assert_one_line_error
from tests.onnx_builders import stateful_vad, vad_numpy, vad_stream

pytest.importorskip("onnxruntime", reason="the layouts are checked in onnxruntime (edgesdk[convert])")
pytest.importorskip("onnx", reason="the model is built with onnx.helper (edgesdk[convert])")


@pytest.fixture(scope="module")
def vad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vad")
    return stateful_vad(folder / "vad.onnx"), folder


def _convert(edgesdk_cli, model, folder, name, data, *extra):
    np.savez(folder / f"{name}.npz", **data)
    out = folder / f"out-{name}"
    proc = edgesdk_cli(
        "convert", str(model), "--profile", "rpi5-8gb", "--out", str(out), "--calibration", str(folder / f"{name}.npz"),
        "--formats", "onnx", "--precisions", "fp32", *extra,
    )  # fmt: skip
    return proc, out


def test_data_in_the_models_own_layout_converts_and_matches_the_model(edgesdk_cli, vad) -> None:
    model, folder = vad
    proc, out = _convert(edgesdk_cli, model, folder, "own", vad_stream(24))
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert [v.id for v in report.variants] == ["onnx-fp32"]
    assert report.variants[0].accuracy.max_abs_diff == {"prob": 0.0, "stateN": 0.0}
    assert any("state: axis 1" in d and "sr: constant" in d for d in report.decisions), report.decisions
    # golden.npz is one batch in the model's layout, as the agent's smoke test feeds it.
    golden = np.load(out / "golden.npz")
    assert golden["state"].shape == (2, 1, 8) and golden["sr"].shape == ()
    want = vad_numpy({k: golden[k] for k in ("audio", "state", "sr")})
    np.testing.assert_allclose(golden["output:stateN"], want["stateN"], atol=1e-6)


def test_a_value_per_sample_for_a_0d_input_is_fed_one_sample_per_call(edgesdk_cli, vad) -> None:
    model, folder = vad
    data = {**vad_stream(12), "sr": np.array([16000, 8000] * 6, np.int64)}
    proc, out = _convert(edgesdk_cli, model, folder, "per-sample", data)
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert report.variants[0].accuracy.value > 0.9999
    assert any("sr: unbatched" in d for d in report.decisions), report.decisions


def test_the_issues_three_failures_are_each_one_line(edgesdk_cli, vad) -> None:
    model, folder = vad
    # 1. A 0-d array for an input that is not 0-d (was: IndexError traceback from the pipeline).
    proc, _ = _convert(edgesdk_cli, model, folder, "zero-d", {**vad_stream(8), "audio": np.array(0.5, np.float32)})
    assert_one_line_error(proc, "input 'audio'", "has shape ()", "expects (batch, 32)")
    # 2. Per-sample values of the wrong rank for the 0-d input (was: "has shape (200,); expects (N)").
    proc, _ = _convert(edgesdk_cli, model, folder, "sr-col", {**vad_stream(8), "sr": np.full((8, 1), 16000, np.int64)})
    assert_one_line_error(proc, "input 'sr'", "(8, 1)", "the model expects ()", "(N,)")
    # 3. The state laid out sample-first (was: onnxruntime's multi-line error).
    swapped = {**vad_stream(8), "state": np.zeros((8, 2, 8), np.float32)}
    proc, _ = _convert(edgesdk_cli, model, folder, "swapped", swapped)
    assert_one_line_error(proc, "input 'state'", "(8, 2, 8)", "(2, N, 8)", "--batch-axis state=AXIS")
    # ... and declared on an axis the model fixes: refused before onnxruntime sees it.
    state_first = {**vad_stream(3), "state": np.zeros((2, 3, 8), np.float32)}
    proc, _ = _convert(edgesdk_cli, model, folder, "declared", state_first, "--batch-axis", "state=2")
    assert_one_line_error(proc, "input 'state'", "(2, batch, 8)", "axis 2 is fixed at 8")
    proc, _ = _convert(
        edgesdk_cli, model, folder, "declared0", {**vad_stream(2), "state": np.zeros((2, 2, 8), np.float32)},
        "--batch-axis", "state=0",
    )  # fmt: skip
    assert_one_line_error(proc, "input 'state'", "axis 0 is fixed at 2")


def test_a_data_spec_file_declares_the_layout_and_a_bad_one_is_one_line(edgesdk_cli, vad) -> None:
    model, folder = vad
    spec = folder / "layout.yaml"
    spec.write_text("schema_version: 1\nbatch_axes: {state: 1, stateN: 1}\nstate: {state: stateN}\n")
    proc, out = _convert(edgesdk_cli, model, folder, "spec", vad_stream(4, steps=3), "--data-spec", str(spec))
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert any(d.startswith("stateful: state → stateN fed back over streams of 3 steps") for d in report.decisions)
    spec.write_text("batch_axis: {state: 1}\n")
    proc, _ = _convert(edgesdk_cli, model, folder, "bad-spec", vad_stream(4), "--data-spec", str(spec))
    assert_one_line_error(proc, "--data-spec", "batch_axis")
