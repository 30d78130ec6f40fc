"""The metric chosen for each output of public models as they ship (issue 38, defect 7).

RapidOCR's paddle2onnx exports and MediaPipe's .tflite files, run in their own runtime on a few
random images; ``resolve`` picks each output's metric from its name, shape and values as
``convert`` does: the recognizer's softmax steps get decoded text (ctc), the orientation
classifier top-1, the detector's probability map a mask IoU, landmarks an error in pixels.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.prebuilt_models import MEDIAPIPE, RAPIDOCR, extract

pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")


def _onnx_outputs(path, shape) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
    values = session.run(None, {session.get_inputs()[0].name: image})
    return {o.name: v for o, v in zip(session.get_outputs(), values, strict=True)}


def _tflite_outputs(path, count: int = 2) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    (detail,) = interpreter.get_input_details()
    rows: dict[str, list[np.ndarray]] = {}
    for seed in range(count):
        image = np.random.default_rng(seed).uniform(0, 1, detail["shape"]).astype(np.float32)
        interpreter.set_tensor(detail["index"], image)
        interpreter.invoke()
        for out in interpreter.get_output_details():
            rows.setdefault(out["name"], []).append(interpreter.get_tensor(out["index"]).reshape(1, -1))
    return {name: np.concatenate(values) for name, values in rows.items()}


@pytest.mark.parametrize(
    ("name", "shape", "kinds"),
    [
        ("ch_PP-OCRv4_rec_infer.onnx", (2, 3, 48, 320), {"softmax_11.tmp_0": "ctc"}),
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (2, 3, 48, 192), {"save_infer_model/scale_0.tmp_1": "top1"}),
        ("ch_PP-OCRv4_det_infer.onnx", (2, 3, 64, 64), {"sigmoid_0.tmp_0": "iou"}),
    ],
)
def test_rapidocr_outputs_get_decoded_text_top1_and_mask_iou(name, shape, kinds, tmp_path) -> None:
    from edgesdk.converters.output_metrics import resolve

    chosen = resolve(_onnx_outputs(extract(RAPIDOCR, name, tmp_path), shape), {})
    assert {n: m.kind for n, m in chosen.items()} == kinds, {n: m.why for n, m in chosen.items()}
    assert all(m.why for m in chosen.values())


def test_mediapipe_landmarks_are_judged_in_pixels_not_by_argmax(tmp_path) -> None:
    pytest.importorskip("ai_edge_litert", reason="the .tflite sources run in LiteRT (edgesdk[litert])")
    from edgesdk.converters.output_metrics import resolve

    hand = resolve(_tflite_outputs(extract(MEDIAPIPE, "hand_landmark/hand_landmark_full.tflite", tmp_path)), {})
    assert {n: m.kind for n, m in hand.items()} == {f"Identity{s}": "abs" for s in ("", "_1", "_2", "_3")}
    iris = resolve(_tflite_outputs(extract(MEDIAPIPE, "iris_landmark/iris_landmark.tflite", tmp_path)), {})
    assert {m.kind for m in iris.values()} == {"abs"} and len(iris) == 2
    assert iris["output_iris"].threshold > 0.1  # 1 % of a 64 px frame's coordinates, in pixels
