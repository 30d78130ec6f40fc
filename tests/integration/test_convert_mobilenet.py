"""MobileNetV2 with real ImageNet weights through the converters (slow: one real-size model).

The int8 gate on the bundled photos is 95% top-1 agreement with fp32 (the issue's figure);
OpenVINO's NNCF int8 holds it here, and every shipped variant must.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.schemas.report import ConversionReport

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mobilenet_data(request):
    pytest.importorskip("skimage", reason="MobileNetV2 photos come from scikit-image (pip install 'edgesdk[dev]')")
    pytest.importorskip("torch")
    from edgesdk.errors import ModelError
    from edgesdk.workloads.mobilenet import prepare_mobilenet, weights_bytes

    try:
        weights_bytes()
    except ModelError as exc:
        pytest.skip(str(exc))
    return prepare_mobilenet(Path(request.config.cache.mkdir("edgesdk-mobilenet-v2")))


def test_mobilenet_v2_to_openvino_ships_a_gated_ladder(edgesdk_cli, mobilenet_data, tmp_path) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    out = tmp_path / "out"
    proc = edgesdk_cli(
        "convert", "edgesdk.workloads.mobilenet:pretrained_mobilenet_v2", "--profile", "intel-nuc-core-ultra",
        "--formats", "openvino", "--out", str(out), "--calibration", str(mobilenet_data.calibration),
        "--validation", str(mobilenet_data.validation), "--output-names", "logits", "--gate", "0.95",
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    shipped = {v.precision.value: v for v in report.variants}
    assert set(shipped) == {"fp32", "fp16", "int8"}, report.rejected
    assert all(v.accuracy.value >= 0.95 and v.accuracy.samples == len(mobilenet_data.names) for v in report.variants)
    assert shipped["fp32"].accuracy.value == 1.0
    assert shipped["int8"].size < 0.30 * shipped["fp32"].size
    assert shipped["fp16"].size < 0.55 * shipped["fp32"].size
    assert shipped["int8"].inputs[0].shape[1:] == [3, 224, 224]
