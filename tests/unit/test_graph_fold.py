"""Normalization folded into an ONNX graph (converters/graph_fold.py): the folded graph fed raw
pixels answers what the pipeline's numpy normalization + the original graph answer; the agent's
pipeline skips the folded step; each format is folded in its own graph file."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="folding rewrites ONNX graphs (the convert extra)")
ort = pytest.importorskip("onnxruntime", reason="the folded graph is run to compare")
pytest.importorskip("PIL", reason="the pipeline's image steps decode with Pillow (the pipeline extra)")

from edgesdk.converters.end_to_end import fold_steps  # noqa: E402
from edgesdk.converters.graph_fold import fold_artifact, fold_normalize, raw_pixels  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk.pipeline import preprocess  # noqa: E402
from edgesdk.schemas.common import ModelFormat, Precision  # noqa: E402
from edgesdk.schemas.pipeline import ImagePre, Pipeline  # noqa: E402

MEAN, STD, SCALE = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 1 / 255


def _conv_model(layout: str) -> onnx.ModelProto:
    """A 3→2 channel 1x1 convolution (NHWC: transposed in and out), so channels matter."""
    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.normal(size=(2, 3, 1, 1)).astype(np.float32), "w")
    shape = [1, 3, 8, 8] if layout == "NCHW" else [1, 8, 8, 3]
    nodes = [helper.make_node("Conv", ["x" if layout == "NCHW" else "x_nchw", "w"], ["y"])]
    if layout == "NHWC":
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_folded_graph_on_pixels_equals_normalize_then_model(layout: str) -> None:
    pre = ImagePre(scale=SCALE, mean=MEAN, std=STD, layout=layout)
    shape = (1, 3, 8, 8) if layout == "NCHW" else (1, 8, 8, 3)
    channel = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    pixels = np.random.default_rng(1).integers(0, 256, size=shape).astype(np.float32)
    normalized = (pixels * np.float32(SCALE) - np.reshape(MEAN, channel).astype(np.float32)) / np.reshape(
        STD, channel
    ).astype(np.float32)
    expected = _run(_conv_model(layout), normalized.astype(np.float32))
    folded = fold_normalize(_conv_model(layout), pre)
    onnx.checker.check_model(folded)
    assert [i.name for i in folded.graph.input] == ["x"]  # the input keeps its name
    np.testing.assert_allclose(_run(folded, pixels), expected, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(raw_pixels(normalized, pre), pixels, atol=1e-3)


def test_a_folding_pipeline_feeds_the_decoded_pixels_not_the_normalized_tensor() -> None:
    from PIL import Image

    body = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(body, format="PNG")
    spec = [SimpleNamespace(name="x", dtype="float32", shape=[1, 3, 8, 8])]
    plain = Pipeline(image=ImagePre(scale=SCALE, mean=MEAN, std=STD))
    folded = plain.model_copy(update={"folded": ["normalize"]})
    assert float(preprocess(folded, body.getvalue(), "image/png", spec)["x"].max()) == 200.0
    assert float(preprocess(plain, body.getvalue(), "image/png", spec)["x"].max()) < 3.0


def test_folding_is_done_per_format_in_its_own_graph_file(tmp_path: Path) -> None:
    pipeline = Pipeline(image=ImagePre(scale=SCALE, mean=MEAN, std=STD), folded=["normalize"])
    path = tmp_path / "model.onnx"
    onnx.save(_conv_model("NCHW"), str(path))

    def variant(fmt: ModelFormat) -> SimpleNamespace:
        planned = SimpleNamespace(format=fmt, precision=Precision.FP32)
        return SimpleNamespace(planned=planned, artifact=SimpleNamespace(files={"model.onnx": path}))

    assert fold_steps(pipeline, variant(ModelFormat.ONNX)) is None
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Mul", "Add", "Conv"]
    for fmt, graph in ((ModelFormat.TFLITE, ".tflite"), (ModelFormat.COREML, "/model.mlmodel")):
        reason = fold_steps(pipeline, variant(fmt))  # each format is folded in its own graph file
        assert reason is not None and f"expected one {graph} file" in reason, reason
    with pytest.raises(Exception, match="expected one .onnx file"):
        fold_artifact({}, pipeline.image)
    with pytest.raises(ValueError, match="names image steps"):
        Pipeline(input="audio", folded=["normalize"])
