"""Normalization and the uint8 cast folded per format (graph_fold.py, fold_tflite.py,
fold_openvino.py, fold_variant.py): each folded graph fed the decoder's pixels answers what numpy
normalization + the unfolded graph answers; a fold that moves the outputs is caught before the
variant ships; the agent hands uint8 as decoded and refuses a variant whose input is not the
dtype the pipeline's folded steps need."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="folding rewrites ONNX graphs (the convert extra)")
ort = pytest.importorskip("onnxruntime", reason="the folded graph is run to compare")

from edgesdk.converters.graph_fold import fold_normalize, raw_pixels  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk.errors import AgentError, ConversionError  # noqa: E402
from edgesdk.schemas.manifest import TensorSpec  # noqa: E402
from edgesdk.schemas.pipeline import ImagePre, Pipeline  # noqa: E402

MEAN, STD, SCALE = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 1 / 255
PRE = ImagePre(scale=SCALE, mean=MEAN, std=STD)


def _conv_onnx() -> onnx.ModelProto:
    """A 3→2 channel 1x1 convolution on a 1x3x8x8 input named ``x`` (NCHW)."""
    weight = numpy_helper.from_array(np.random.default_rng(7).normal(size=(2, 3, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _pixels_and_normalized() -> tuple[np.ndarray, np.ndarray]:
    pixels = np.random.default_rng(1).integers(0, 256, size=(1, 3, 8, 8)).astype(np.uint8)
    channel = (1, 3, 1, 1)
    normalized = (pixels.astype(np.float32) * np.float32(SCALE) - np.reshape(MEAN, channel).astype(np.float32)) / (
        np.reshape(STD, channel).astype(np.float32)
    )
    return pixels, normalized.astype(np.float32)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def test_onnx_cast_fold_takes_uint8_pixels_and_answers_as_the_unfolded_graph() -> None:
    pixels, normalized = _pixels_and_normalized()
    expected = _ort(_conv_onnx(), normalized)
    folded = fold_normalize(_conv_onnx(), PRE, cast=True)
    onnx.checker.check_model(folded)
    assert folded.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert [n.op_type for n in folded.graph.node[:3]] == ["Cast", "Mul", "Add"]
    np.testing.assert_allclose(_ort(folded, pixels), expected, atol=1e-5)


def test_openvino_prepostprocessor_fold_answers_as_the_unfolded_ir(tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino", reason="the OpenVINO fold uses its PrePostProcessor")
    from edgesdk.converters.fold_openvino import fold_openvino_file

    pixels, normalized = _pixels_and_normalized()
    expected = _ort(_conv_onnx(), normalized)
    onnx.save(_conv_onnx(), str(tmp_path / "m.onnx"))
    for cast in (False, True):
        xml = tmp_path / f"cast{cast}" / "model.xml"
        xml.parent.mkdir()
        ov.save_model(ov.convert_model(str(tmp_path / "m.onnx")), str(xml), compress_to_fp16=False)
        fold_openvino_file(xml, PRE, cast)
        assert not (xml.parent / "model.folded.xml").exists()
        compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        assert compiled.inputs[0].get_element_type() == (ov.Type.u8 if cast else ov.Type.f32)
        assert compiled.inputs[0].get_any_name() == "x"  # the input keeps its name
        fed = pixels if cast else pixels.astype(np.float32)
        np.testing.assert_allclose(compiled({0: fed})[0], expected, atol=1e-5)


def _mul_tflite(weights: np.ndarray) -> bytes:
    """A one-op .tflite, ``y = x * w`` with ``w`` per channel (1x3x1x1) on a 1x3x8x8 input:
    written with LiteRT's own schema, so no converter runs in this test."""
    from ai_edge_litert import schema_py_generated as fb
    from ai_edge_litert.tools import flatbuffer_utils

    def tensor(name: str, shape: tuple[int, ...], buffer: int) -> Any:
        t = fb.TensorT()
        t.name, t.shape, t.type, t.buffer = name, np.asarray(shape, np.int32), fb.TensorType.FLOAT32, buffer
        return t

    empty, data = fb.BufferT(), fb.BufferT()
    data.data = np.frombuffer(weights.astype(np.float32).tobytes(), np.uint8)
    code = fb.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = fb.BuiltinOperator.MUL
    code.version = 1
    op = fb.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, np.asarray([0, 1], np.int32), np.asarray([2], np.int32)
    op.builtinOptionsType, op.builtinOptions = fb.BuiltinOptions.MulOptions, fb.MulOptionsT()
    subgraph = fb.SubGraphT()
    subgraph.tensors = [tensor("x", (1, 3, 8, 8), 1), tensor("w", (1, 3, 1, 1), 2), tensor("y", (1, 3, 8, 8), 1)]
    subgraph.inputs, subgraph.outputs, subgraph.operators = np.asarray([0]), np.asarray([2]), [op]
    model = fb.ModelT()
    model.version, model.operatorCodes, model.subgraphs, model.buffers = (
        3,
        [code],
        [subgraph],
        [fb.BufferT(), empty, data],
    )
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def test_litert_flatbuffer_fold_answers_as_the_unfolded_tflite() -> None:
    pytest.importorskip("ai_edge_litert", reason="the folded .tflite runs in LiteRT")
    from ai_edge_litert.interpreter import Interpreter
    from edgesdk.converters.fold_tflite import fold_tflite
    from edgesdk.converters.tflite_graph import _read, _write

    def run(model: bytes, x: np.ndarray) -> tuple[np.ndarray, Any]:
        interpreter = Interpreter(model_content=model)
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        interpreter.set_tensor(detail["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), detail["dtype"]

    plain = _mul_tflite(np.asarray([0.5, -2.0, 3.0]).reshape(1, 3, 1, 1))
    pixels, normalized = _pixels_and_normalized()
    expected, _ = run(plain, normalized)
    for cast, fed in ((False, pixels.astype(np.float32)), (True, pixels)):
        got, dtype = run(fold_tflite(plain, PRE, cast), fed)
        assert dtype == fed.dtype.type
        np.testing.assert_allclose(got, expected, atol=1e-5)
    graph = _read(plain)  # a full-integer model's input: int8 codes, not pixels
    graph.subgraphs[0].tensors[graph.subgraphs[0].inputs[0]].type = 9  # TensorType.INT8
    with pytest.raises(ConversionError, match="full-integer"):
        fold_tflite(_write(graph), PRE)


def _built(path: Path, validated: bool = True) -> SimpleNamespace:
    from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName

    planned = SimpleNamespace(format=ModelFormat.ONNX, precision=Precision.FP32, runtime=RuntimeName("onnxruntime"))
    planned.options = {}
    spec = TensorSpec(name="x", dtype="float32", shape=[1, 3, 8, 8])
    result = SimpleNamespace(inputs=[spec], accuracy=None)
    return SimpleNamespace(
        planned=planned, artifact=SimpleNamespace(files={"model.onnx": path}), result=result, validated=validated
    )


def test_a_fold_that_moves_the_outputs_is_caught_before_the_variant_ships(tmp_path: Path, monkeypatch) -> None:
    from edgesdk.converters import fold_variant
    from edgesdk.converters.graph_fold import fold_artifact

    pipeline = Pipeline(image=PRE, folded=["normalize", "cast"])
    feeds = [{"x": _pixels_and_normalized()[0].astype(np.float32)}]
    good = tmp_path / "good.onnx"
    onnx.save(_conv_onnx(), str(good))
    built = _built(good)
    assert fold_variant.fold_built(pipeline, built, feeds) is None
    assert built.result.inputs[0].dtype == "uint8"  # what the manifest will declare
    wrong = PRE.model_copy(update={"std": [0.5, 0.5, 0.5]})  # a fold with other constants
    monkeypatch.setattr(
        fold_variant, "fold_artifact", lambda files, pre, fmt, cast: fold_artifact(files, wrong, fmt, cast)
    )
    bad = tmp_path / "bad.onnx"
    onnx.save(_conv_onnx(), str(bad))
    reason = fold_variant.fold_built(pipeline, _built(bad), feeds)
    assert reason is not None and reason.startswith("fp32 dropped: folding moved output 'y' by"), reason


def test_the_agent_hands_uint8_pixels_to_a_cast_folded_graph() -> None:
    Image = pytest.importorskip("PIL.Image", reason="the pipeline's image steps decode with Pillow")
    from edgesdk.pipeline import preprocess

    picture = np.random.default_rng(3).integers(0, 256, size=(8, 8, 3)).astype(np.uint8)
    body = io.BytesIO()
    Image.fromarray(picture).save(body, format="PNG")
    pipeline = Pipeline(image=PRE, folded=["normalize", "cast"])
    fed = preprocess(pipeline, body.getvalue(), "image/png", [SimpleNamespace(name="x", dtype="uint8")])["x"]
    assert fed.dtype == np.uint8 and fed.flags.c_contiguous
    np.testing.assert_array_equal(fed[0], picture.transpose(2, 0, 1))
    with pytest.raises(ValueError, match="needs normalize folded too"):
        Pipeline(image=PRE, folded=["cast"])


def test_the_agent_refuses_a_variant_whose_input_is_not_what_the_folded_steps_need() -> None:
    from edgesdk.agent.folded_inputs import check_folded_input

    def variant(dtype: str) -> tuple[SimpleNamespace, SimpleNamespace]:
        spec = TensorSpec(name="x", dtype=dtype, shape=[1, 3, 8, 8])
        loaded = SimpleNamespace(inputs=[spec], closed=False)
        loaded.close = lambda: setattr(loaded, "closed", True)
        return SimpleNamespace(id=f"onnx-{dtype}", inputs=[spec]), loaded

    cast = Pipeline(image=PRE, folded=["normalize", "cast"])
    normalize = Pipeline(image=PRE, folded=["normalize"])
    accepted = [(cast, "uint8"), (cast, "float32"), (normalize, "float32"), (None, "float32"), (Pipeline(), "uint8")]
    for pipeline, dtype in accepted:  # (cast, float32): a Core ML variant of a cast bundle declares float32
        meta, loaded = variant(dtype)
        check_folded_input(pipeline, meta, loaded)  # type: ignore[arg-type]
        assert not loaded.closed
    meta, loaded = variant("uint8")
    loaded.inputs = [loaded.inputs[0].model_copy(update={"dtype": "float32"})]  # a graph without the cast
    with pytest.raises(AgentError, match=r"takes float32 \(manifest: uint8\)"):
        check_folded_input(cast, meta, loaded)  # type: ignore[arg-type]
    assert loaded.closed  # its runtime's memory is given back
    for pipeline, dtype, says in ((cast, "int32", "not the uint8 or float"), (normalize, "uint8", "not the float")):
        meta, loaded = variant(dtype)
        with pytest.raises(AgentError, match=says):
            check_folded_input(pipeline, meta, loaded)  # type: ignore[arg-type]
        assert loaded.closed


def test_golden_pixels_are_whole_so_a_uint8_input_does_not_truncate_them() -> None:
    pixels, normalized = _pixels_and_normalized()
    back = raw_pixels(normalized, PRE)
    np.testing.assert_array_equal(back.astype(np.uint8), pixels)  # 254.99998 would be 254
    assert np.array_equal(back, np.rint(back))


def _mul_mlpackage(path: Path) -> None:
    """A one-op ML Program, ``y = x * w`` per channel on a 1x3x8x8 input, built in MIL (no torch)."""
    ct = pytest.importorskip("coremltools", reason="the Core ML fold rewrites an ML Program with coremltools")
    from coremltools.converters.mil import Builder as mb

    weights = np.asarray([0.5, -2.0, 3.0], np.float32).reshape(1, 3, 1, 1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 8, 8))], opset_version=ct.target.iOS16)
    def program(x: Any) -> Any:
        return mb.mul(x=x, y=weights, name="y")

    ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16, skip_model_load=True).save(
        str(path)
    )


def test_core_ml_fold_prepends_mul_and_add_with_the_pipelines_constants(tmp_path: Path) -> None:
    ct = pytest.importorskip("coremltools", reason="the Core ML fold rewrites an ML Program with coremltools")
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_to_program
    from edgesdk.converters.graph_fold import affine, fold_artifact

    package = tmp_path / "model.mlpackage"
    _mul_mlpackage(package)
    before = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    weights = str(package / "Data/com.apple.CoreML/weights")
    unfolded = [
        op.op_type
        for op in milproto_to_program(before, before.specificationVersion, weights).functions["main"].operations
    ]
    files = {f"model.mlpackage/{p.relative_to(package).as_posix()}": p for p in package.rglob("*") if p.is_file()}
    fold_artifact(files, PRE, "coreml", cast=True)  # the cast is not folded: Core ML takes float32
    assert all(path.is_file() for path in files.values()) and any(n.endswith("/model.mlmodel") for n in files)
    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    assert spec.description.input == before.description.input  # name, shape, FLOAT32 kept
    assert spec.description.output == before.description.output
    main = milproto_to_program(spec, spec.specificationVersion, weights)
    ops = [op for op in main.functions["main"].operations if op.op_type != "const"]
    # The fold's fp32 mul + add first, then the program as it was (fp16 compute: its casts kept).
    assert [op.op_type for op in ops] == ["mul", "add", *[t for t in unfolded if t != "const"]]
    a, b = affine(PRE)
    np.testing.assert_allclose(ops[0].y.val.ravel(), a.ravel(), rtol=1e-6)
    np.testing.assert_allclose(ops[1].y.val.ravel(), b.ravel(), rtol=1e-6)


def test_core_ml_folded_program_predicts_as_the_unfolded_one(tmp_path: Path) -> None:
    ct = pytest.importorskip("coremltools", reason="the Core ML fold rewrites an ML Program with coremltools")
    try:
        from coremltools import libcoremlpython  # noqa: F401
    except ImportError:
        pytest.skip("Core ML predicts only on macOS (coremltools has no libcoremlpython here): spec checked only")
    from edgesdk.converters.fold_coreml import fold_coreml_package

    package = tmp_path / "model.mlpackage"
    _mul_mlpackage(package)
    pixels, normalized = _pixels_and_normalized()
    want = next(iter(ct.models.MLModel(str(package)).predict({"x": normalized}).values()))
    fold_coreml_package(package, PRE)
    got = next(iter(ct.models.MLModel(str(package)).predict({"x": pixels.astype(np.float32)}).values()))
    np.testing.assert_allclose(got, want, atol=1e-4)
