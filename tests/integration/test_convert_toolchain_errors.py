"""A model OpenVINO's frontend cannot convert: the rejection keeps OpenVINO's cause (not only its
``Check 'false' failed at …unconverted_ops_report.cpp`` first line), in the report and in the
CLI's one-line error; ``EDGESDK_DEBUG=1`` shows the whole native message."""

from __future__ import annotations

import os

import numpy as np
import pytest

from edgesdk.schemas.report import ConversionReport
from tests.conftest import assert_one_line_error
from tests.onnx_builders import rank_unknown_inside

pytest.importorskip("openvino", reason="the cause is OpenVINO's (edgesdk[convert-openvino])")
pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")

CAUSE = "LpNormalization-17 (node y): Cannot get length of dynamic dimension"


@pytest.fixture
def model(tmp_path):
    path = rank_unknown_inside(tmp_path / "rank_unknown.onnx")
    rng = np.random.default_rng(0)
    # ``shape`` is the same for every sample: a constant of the input's full shape (--batch-axis shape=none).
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((16, 8)).astype(np.float32), shape=np.array([-1, 8]))
    return path, tmp_path


def _convert(edgesdk_cli, path, folder, formats, env=None):
    return edgesdk_cli(
        "convert", str(path), "--profile", "rpi5-8gb", "--out", str(folder / f"out-{formats}"),
        "--calibration", str(folder / "cal.npz"), "--batch-axis", "shape=none", "--formats", formats,
        "--precisions", "fp32", env=env,
    )  # fmt: skip


def test_the_rejection_in_the_report_carries_openvinos_cause(edgesdk_cli, model) -> None:
    path, folder = model
    proc = _convert(edgesdk_cli, path, folder, "onnx,openvino")
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((folder / "out-onnx,openvino" / "report.json").read_text())
    assert [v.id for v in report.variants] == ["onnx-fp32"]
    (rejected,) = report.rejected
    assert rejected.format.value == "openvino" and CAUSE in rejected.reason, rejected.reason
    assert "unconverted_ops_report.cpp" not in rejected.reason and "\n" not in rejected.reason


def test_the_cli_error_is_one_line_with_the_cause_and_debug_shows_the_whole_message(edgesdk_cli, model) -> None:
    path, folder = model
    proc = _convert(edgesdk_cli, path, folder, "openvino")
    assert_one_line_error(proc, "no variant of rank_unknown can ship", CAUSE)
    env = {**os.environ, "EDGESDK_DEBUG": "1"}
    debug = _convert(edgesdk_cli, path, folder, "openvino", env=env)
    assert debug.returncode != 0
    assert "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp" in debug.stderr
    assert "Cannot get length of dynamic dimension" in debug.stderr
