"""OpenVINO's nncf-ptq-accuracy-control recipe: its per-sample metric, its place in the recipe
search (calibration data needed, never repaired again), and one build on a tiny convnet."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.openvino_backend import (
    ACCURACY_CONTROL,
    ACCURACY_CONTROL_MAX_DROP,
    agreement_per_sample,
)
from edgesdk.converters.planner import SELF_REPAIRING, STATIC_INT8
from edgesdk.converters.recipes import RECIPES, Family
from edgesdk.converters.registry import CONVERTERS


def test_top1_agreement_per_sample() -> None:
    reference = [np.array([[0.1, 0.9, 0.0]]), np.array([[0.5, 0.2, 0.3]])]
    outputs = [np.array([[0.0, 1.0, 0.2]]), np.array([[0.1, 0.2, 0.3]])]
    assert agreement_per_sample("top1", outputs, reference) == [1.0, 0.0]


def test_cosine_per_sample() -> None:
    reference = [np.array([1.0, 0.0]), np.array([0.0, 0.0])]
    outputs = [np.array([1.0, 1.0]), np.array([0.0, 0.0])]
    values = agreement_per_sample("cosine", outputs, reference)
    assert values[0] == pytest.approx(2**-0.5) and values[1] == 1.0


def test_the_recipe_is_searched_for_convnets_and_not_repaired_again() -> None:
    assert ACCURACY_CONTROL in RECIPES["openvino"][Family.CONVNET]
    assert ACCURACY_CONTROL in CONVERTERS["openvino"].capabilities.int8_methods
    assert ACCURACY_CONTROL in STATIC_INT8  # needs calibration data
    assert ACCURACY_CONTROL in SELF_REPAIRING  # it keeps layers in float itself
    assert 0 < ACCURACY_CONTROL_MAX_DROP["top1"] < 0.1


@pytest.mark.slow  # importing NNCF and its accuracy control: ~30 s on a shared 2-core host
def test_builds_a_tiny_convnet_validated_on_its_calibration_samples(tmp_path) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    pytest.importorskip("onnx")
    from edgesdk.converters.base import ConversionRequest
    from edgesdk.converters.openvino_backend import OpenVINOConverter, float_weight_ops

    from edgesdk.schemas.common import Precision
    from tests.onnx_builders import convnet_source, tiny_convnet

    rng = np.random.default_rng(0)
    path = tiny_convnet(tmp_path / "convnet.onnx", convs=2)
    source = convnet_source(path, np.zeros((1, 3, 8, 8), np.float32))
    calibration = {"x": rng.standard_normal((24, 3, 8, 8)).astype(np.float32)}
    artifact = OpenVINOConverter().convert(
        ConversionRequest(
            source, Precision.INT8, tmp_path / "ov", method=ACCURACY_CONTROL, calibration=calibration
        )  # fmt: skip
    )
    assert artifact.method == ACCURACY_CONTROL
    assert any(n.startswith("accuracy control on the calibration samples kept ") for n in artifact.notes)
    import openvino as ov

    model = ov.Core().read_model(str(artifact.files["model.xml"]))
    assert float_weight_ops(model) < 3  # something is int8
    assert any(op.get_type_name() == "FakeQuantize" for op in model.get_ops())
    assert float_weight_ops(ov.Core().read_model(str(path))) == 3  # the fp32 model: every weight float


def test_accuracy_control_counts_a_sample_only_when_every_output_holds_its_own_metric() -> None:
    from edgesdk.converters.openvino_backend import outputs_hold_per_sample

    from edgesdk.quality.output_metrics import OutputMetric

    metrics = {"logits": OutputMetric("top1", 0.99), "landmarks": OutputMetric("abs", 1.5)}
    reference = [[np.array([0.1, 0.9]), np.array([10.0, 20.0])], [np.array([0.8, 0.2]), np.array([5.0, 6.0])]]
    # Both samples keep their class; the second's landmarks are 47 px off (the first output alone passed it).
    outputs = [[np.array([0.2, 0.8]), np.array([10.5, 20.0])], [np.array([0.7, 0.3]), np.array([52.0, 6.0])]]
    assert outputs_hold_per_sample(metrics, outputs, reference) == [1.0, 0.0]
