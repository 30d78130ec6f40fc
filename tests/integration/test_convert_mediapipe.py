"""MediaPipe's .tflite models as they ship (issue 38): no SignatureDef, weights stored as float16
feeding Dequantize ops (fp32 compute), converted for a Pi Zero 2 W class profile (no fp16) and
a Pi 5, and served by a real agent.

The models come from MediaPipe 0.10.14's wheel (tests/prebuilt_models.py); the data are a few
random images, enough for the routes checked here (each conversion a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters import convert

from edgesdk.schemas.report import ConversionReport
from tests import agent_helpers
from tests.prebuilt_models import MEDIAPIPE, extract

pytest.importorskip("ai_edge_litert", reason="the .tflite sources are validated in LiteRT (edgesdk[litert])")

PI_ZERO = "rpi-zero-2w"  # LiteRT with fp32 and int8, no fp16
PI_5 = "rpi5-8gb"
HAND = "hand_landmark/hand_landmark_full.tflite"
SELFIE = "selfie_segmentation/selfie_segmentation.tflite"
IRIS = "iris_landmark/iris_landmark.tflite"


def _images(model: Path, count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` random images in [0, 1], keyed and shaped as the model's one input."""
    from ai_edge_litert.interpreter import Interpreter

    (detail,) = Interpreter(model_path=str(model)).get_input_details()
    shape = (count, *detail["shape"][1:])
    return {detail["name"]: np.random.default_rng(seed).uniform(0, 1, shape).astype(np.float32)}


def _by_tensor_index(model: Path, image: np.ndarray) -> dict[str, np.ndarray]:
    """The source's outputs as LiteRT gives them by tensor index: what the model means."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image)
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def _convert(model: Path, profile: str, out: Path, **options) -> ConversionReport:
    return convert(model, profile, out, calibration=_images(model, 2, 0), validation=_images(model, 3, 1), **options)


def test_hand_landmark_converts_for_a_pi_5_to_a_real_openvino_fp32_and_its_int8_miss_is_not_repaired(
    tmp_path,
) -> None:
    pytest.importorskip("nncf", reason="OpenVINO int8 needs edgesdk[convert-openvino]")
    model = extract(MEDIAPIPE, HAND, tmp_path)
    report = _convert(
        model, PI_5, tmp_path / "out", formats=["openvino"], precisions=["fp32", "int8"], int8_methods=["nncf-ptq"]
    )
    (fp32,) = report.variants
    assert fp32.id == "openvino-fp32"
    # Signature-less: the I/O are the interpreter's tensors, by name.
    assert [s.name for s in fp32.inputs] == ["input_1"]
    assert sorted(s.name for s in fp32.outputs) == ["Identity", "Identity_1", "Identity_2", "Identity_3"]
    # Converted from the weights dequantized ahead of time: float32 weights, about twice the bytes.
    assert fp32.size > 1.9 * model.stat().st_size
    # The int8 misses on random images; repair (which reads ONNX graphs) is skipped with the
    # reason instead of opening the .tflite as ONNX, and the fp32 still ships.
    (int8,) = [r for r in report.rejected if r.format.value == "openvino" and r.precision.value == "int8"]
    assert "not repaired: repair reads an ONNX graph and this source is a tflite file" in int8.reason, int8


def test_selfie_segmentation_fp16_storage_ships_as_is_to_a_pi_zero_as_fp32_and_to_a_pi_5_as_fp16(
    tmp_path,
) -> None:
    model = extract(MEDIAPIPE, SELFIE, tmp_path)
    zero = _convert(model, PI_ZERO, tmp_path / "zero", as_is=True)
    (variant,) = zero.variants
    assert (variant.id, variant.quantization_method) == ("tflite-fp32", "as-is")
    assert (tmp_path / "zero" / variant.files[0]).read_bytes() == model.read_bytes()
    assert any("expands to float32 at load" in d for d in zero.decisions), zero.decisions
    five = _convert(model, PI_5, tmp_path / "five", as_is=True)
    assert [v.id for v in five.variants] == ["tflite-fp16"]


@pytest.mark.needs_agent_extra
def test_a_real_agent_serves_a_signatureless_tflite_by_its_tensor_names(tmp_path) -> None:
    httpx = pytest.importorskip("httpx")
    model = extract(MEDIAPIPE, SELFIE, tmp_path)
    out = tmp_path / "out"
    _convert(model, PI_ZERO, out, as_is=True)
    device = agent_helpers.make_device(tmp_path / "device")
    device.install(out, name="selfie")
    image = _images(model, 1, 3)["input_1"]
    with agent_helpers.AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=60) as client:
        response = client.post("/v1/models/selfie/infer", json={"inputs": {"input_1": image.tolist()}})
    assert response.status_code == 200, response.text
    mask = np.asarray(response.json()["outputs"]["activation_10"], np.float32)
    np.testing.assert_allclose(mask, _by_tensor_index(model, image)["activation_10"], atol=1e-6)


def test_an_fp16_with_no_float16_tensor_is_dropped_and_a_real_one_ships(tmp_path) -> None:
    pytest.importorskip("ai_edge_quantizer", reason="tflite fp16 needs edgesdk[convert-tflite]")
    from edgesdk.converters.precision_check import check_fp16
    from edgesdk.converters.tflite_graph import fp16_content

    from edgesdk.errors import ConversionError
    from edgesdk.schemas.common import ModelFormat

    # iris's fp16 was fake only while ai-edge-quantizer misread its deprecated op codes (every op
    # an ADD, nothing cast); the check still drops a file that holds no float16 tensor.
    iris = extract(MEDIAPIPE, IRIS, tmp_path)
    with pytest.raises(ConversionError, match="not fp16: the file holds no float16 tensor"):
        check_fp16(ModelFormat.TFLITE, {"model.tflite": iris}, iris.stat().st_size)
    real = _convert(iris, PI_5, tmp_path / "iris", formats=["tflite"], precisions=["fp32", "fp16"])
    assert [v.id for v in real.variants] == ["tflite-fp32", "tflite-fp16"]
    selfie = _convert(
        extract(MEDIAPIPE, SELFIE, tmp_path), PI_5, tmp_path / "selfie", formats=["tflite"],
        precisions=["fp32", "fp16"],
    )  # fmt: skip
    shipped = {v.id: v for v in selfie.variants}
    assert set(shipped) == {"tflite-fp32", "tflite-fp16"}
    fp16 = (tmp_path / "selfie" / shipped["tflite-fp16"].files[0]).read_bytes()
    assert fp16_content(fp16).stored_weights > 0 and shipped["tflite-fp16"].size < shipped["tflite-fp32"].size


def test_selfie_segmentation_for_a_pi_zero_gets_its_weights_dequantized_bit_identical_and_an_int8_from_them(
    tmp_path,
) -> None:
    pytest.importorskip("ai_edge_quantizer", reason="tflite int8 needs edgesdk[convert-tflite]")
    from edgesdk.converters.tflite_graph import fp16_content

    from edgesdk.runtimes import load_model

    model = extract(MEDIAPIPE, SELFIE, tmp_path)
    out = tmp_path / "out"
    report = _convert(
        model, PI_ZERO, out, formats=["tflite"], precisions=["fp32", "int8"], int8_methods=["dynamic-int8"]
    )
    shipped = {v.id: v for v in report.variants}
    assert set(shipped) == {"tflite-fp32", "tflite-int8"}, report.rejected
    fp32 = (out / shipped["tflite-fp32"].files[0]).read_bytes()
    assert fp16_content(model.read_bytes()).storage_only and fp16_content(fp32).stored_weights == 0
    assert shipped["tflite-fp32"].size > 1.7 * model.stat().st_size
    image = _images(model, 1, 7)["input_1"]
    got, want = load_model("litert", fp32).run({"input_1": image}), _by_tensor_index(model, image)
    np.testing.assert_array_equal(got["activation_10"], want["activation_10"])
    assert shipped["tflite-int8"].size < shipped["tflite-fp32"].size
