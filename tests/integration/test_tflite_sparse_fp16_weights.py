"""MediaPipe's pose_detection stores its float16 weights sparse (DENSIFY → DEQUANTIZE): that is
fp16 storage with fp32 compute, not an "already fp16" model (issue 38). Its fp32 source is the
weights densified and dequantized ahead of time, bit-identical to what LiteRT computes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.prebuilt_models import MEDIAPIPE, extract


def _outputs(model: bytes, x: np.ndarray) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return [interpreter.get_tensor(o["index"]) for o in interpreter.get_output_details()]


def test_sparse_fp16_weights_are_storage_and_dequantize_bit_identical(tmp_path) -> None:
    pytest.importorskip("ai_edge_litert")
    from edgesdk.converters.tflite_graph import dequantize_fp16_weights, fp16_content

    given = extract(MEDIAPIPE, "pose_detection/pose_detection.tflite", tmp_path).read_bytes()
    content = fp16_content(given)
    assert content.storage_only and content.computed == 0
    expanded = dequantize_fp16_weights(given)
    assert fp16_content(expanded) == type(content)(stored_weights=0, computed=0)  # no float16 left
    x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    for got, want in zip(_outputs(expanded, x), _outputs(given, x), strict=True):
        np.testing.assert_array_equal(got, want)
