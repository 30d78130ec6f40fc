"""The runtimes' errors (what the agent shows in a refusal or an /infer error) carry the cause a
user can act on, not the runtime's C++ source locations or glued-together reporter lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.runtimes import litert_backend
from edgesdk.runtimes.openvino_backend import OpenVINOModel

#: OpenVINO 2024-2026's message for a tensor of the wrong size, as infer() raises it (issue 38).
OPENVINO_INFER = (
    "Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
    "Check 'is_dynamic || port.get_shape() == tensor->get_shape()' failed at "
    "src/plugins/intel_cpu/src/infer_request.cpp:669:\n"
    "The input tensor size is not equal to the model input type: got [1] expecting [].\n"
)
#: LiteRT's reporter as it reached a user (issue 38): messages run together with no newline.
LITERT_GLUED = (
    "failed to delegate MAX_POOL_2D node #29failed to delegate MAX_POOL_2D node #62tflite/kernels/conv.cc:390 "
    "affine_quantization->zero_point->data[i] != 0 (2 != 0)Node number 0 (CONV_2D) failed to prepare."
)


def _raising(message: str):
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError(message)

    return fail


def test_an_openvino_infer_error_reads_without_its_cpp_locations() -> None:
    request = SimpleNamespace(infer=_raising(OPENVINO_INFER))
    compiled = SimpleNamespace(inputs=[], outputs=[], create_infer_request=lambda: request)
    with pytest.raises(InferenceInputError) as caught:
        OpenVINOModel(compiled, None).run({})
    assert str(caught.value) == (
        "OpenVINO rejected the input: The input tensor size is not equal to the model input type: got [1] expecting []."
    )


def test_a_litert_load_error_is_split_and_grouped(monkeypatch) -> None:
    module = SimpleNamespace(Interpreter=_raising(LITERT_GLUED), load_delegate=None)
    monkeypatch.setattr(litert_backend, "_interpreter_module", lambda: module)
    with pytest.raises(RuntimeBackendError) as caught:
        litert_backend.LiteRTBackend().load(b"model")
    assert str(caught.value) == (
        "LiteRT could not load the model: failed to delegate MAX_POOL_2D nodes #29, #62; "
        "tflite/kernels/conv.cc:390 affine_quantization->zero_point->data[i] != 0 (2 != 0); "
        "Node number 0 (CONV_2D) failed to prepare."
    )
