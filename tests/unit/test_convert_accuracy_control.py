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
    onnx = pytest.importorskip("onnx")
    from edgesdk.converters.base import ConversionRequest, SourceModel
    from edgesdk.converters.openvino_backend import OpenVINOConverter, float_weight_ops
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.schemas.common import Precision
    from edgesdk.schemas.manifest import TensorSpec

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
    ]
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
        "b2": rng.standard_normal(8).astype(np.float32),
        "fc": rng.standard_normal((10, 8)).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    path = tmp_path / "convnet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    source = SourceModel(
        "convnet", str(path), path, [TensorSpec(name="x", dtype="float32", shape=["batch", 3, 8, 8])],
        [TensorSpec(name="logits", dtype="float32", shape=["batch", 10])], {"x": np.zeros((1, 3, 8, 8), np.float32)},
    )  # fmt: skip
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
