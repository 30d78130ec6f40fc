"""Older .tflite files (MediaPipe's iris, face models) name their ops only by the deprecated
operator-code field; ai-edge-quantizer reads the other one, took every op for ADD and gave the
conv weights an activation's asymmetric int8, which LiteRT's CONV_2D refuses (issue 38)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.prebuilt_models import MEDIAPIPE, extract


def test_static_int8_of_a_tflite_with_deprecated_op_codes_has_symmetric_weights_and_loads(tmp_path) -> None:
    pytest.importorskip("ai_edge_quantizer")
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import recipe
    from edgesdk.converters.tflite_backend import TFLiteConverter

    model = extract(MEDIAPIPE, "iris_landmark/iris_landmark.tflite", tmp_path).read_bytes()
    calibration = {"input_1": np.random.default_rng(0).uniform(0, 1, (4, 64, 64, 3)).astype(np.float32)}
    int8 = TFLiteConverter()._quantize(model, recipe.static_wi8_ai8(), calibration)
    interpreter = Interpreter(model_content=bytes(int8))
    interpreter.allocate_tensors()  # LiteRT: "conv.cc:390 ... zero_point != 0" before the fix
    kernels = [d for d in interpreter.get_tensor_details() if d["name"].endswith("/Kernel")]
    assert kernels and all(d["dtype"] == np.int8 for d in kernels)
    assert all(not d["quantization_parameters"]["zero_points"].any() for d in kernels)
    assert all(d["quantization_parameters"]["scales"].size > 1 for d in kernels)  # per channel


def test_an_int8_tflite_with_asymmetric_conv_weights_is_refused_at_build_time(tmp_path) -> None:
    pytest.importorskip("ai_edge_quantizer")
    from ai_edge_quantizer import quantizer, recipe
    from edgesdk.converters import tflite_backend, tflite_graph

    from edgesdk.errors import ConversionError

    model = tflite_graph.with_signature(extract(MEDIAPIPE, "iris_landmark/iris_landmark.tflite", tmp_path).read_bytes())
    misread = quantizer.Quantizer(model)  # the op codes left as shipped: what the quantizer did before
    misread.load_quantization_recipe(recipe.static_wi8_ai8())
    feeds = [{"input_1": np.random.default_rng(i).uniform(0, 1, (1, 64, 64, 3)).astype(np.float32)} for i in range(2)]
    bad = bytes(misread.quantize(misread.calibrate({"serving_default": feeds})).quantized_model)
    assert "conv2d/Kernel" in tflite_graph.asymmetric_int8_weights(bad)
    with pytest.raises(ConversionError, match="zero point other than 0 .*conv2d/Kernel.*dynamic-int8"):
        tflite_backend._require_symmetric_weights(bad)
