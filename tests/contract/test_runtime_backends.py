"""Every runtime backend that can run here, through load_variant, on the same cases."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.runtimes import RUNTIME_BACKENDS, available_runtimes, load_variant
from edgesdk.schemas.common import Precision

RUNTIME_CONVERTER = {"onnxruntime": "onnx", "litert": "tflite", "openvino": "openvino", "coreml": "coreml"}
RUNTIMES = [r.value for r in RUNTIME_BACKENDS if r.value in RUNTIME_CONVERTER]


def _runtime(name: str) -> str:
    if name not in [r.value for r in available_runtimes()]:
        pytest.skip(f"runtime {name!r} cannot run on this host")
    return name


@pytest.fixture(scope="module")
def fp32_files(digits_sources, tmp_path_factory):
    from edgesdk.converters.base import ConversionRequest
    from edgesdk.converters.registry import get_converter, missing_packages

    made: dict[str, dict[str, bytes]] = {}

    def get(runtime: str) -> dict[str, bytes]:
        converter_name = RUNTIME_CONVERTER[runtime]
        if missing_packages(converter_name):
            pytest.skip(f"converter {converter_name!r} is not installed, so no {runtime} artifact can be made")
        if runtime not in made:
            artifact = get_converter(converter_name).convert(
                ConversionRequest(digits_sources[0], Precision.FP32, tmp_path_factory.mktemp(runtime))
            )
            made[runtime] = {name: path.read_bytes() for name, path in artifact.files.items()}
        return made[runtime]

    return get


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_loads_from_bytes_and_runs_by_name(runtime, fp32_files, digits_sources) -> None:
    _runtime(runtime)
    _, _, _, validation, reference = digits_sources
    # OpenVINO may run fp32 IR in bf16 on this CPU unless told otherwise (parity needs f32).
    options = {"INFERENCE_PRECISION_HINT": "f32"} if runtime == "openvino" else None
    model = load_variant(runtime, fp32_files(runtime), options=options)
    assert [s.name for s in model.inputs] == ["image"]
    assert [s.name for s in model.outputs] == ["logits"]
    out = model.run({"image": validation["image"][:1]})["logits"]
    assert np.abs(out - reference["logits"][:1]).max() < 1e-3
    model.close()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_garbage_bytes_are_a_runtime_error(runtime) -> None:
    _runtime(runtime)
    files = {
        "onnxruntime": {"model.onnx": b"not a model"},
        "litert": {"model.tflite": b"not a model"},
        "openvino": {"model.xml": b"<net", "model.bin": b""},
        "coreml": {"model.mlpackage/x": b"?"},
    }[runtime]
    with pytest.raises(RuntimeBackendError):
        load_variant(runtime, files)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_missing_file_names_what_is_missing(runtime) -> None:
    with pytest.raises(RuntimeBackendError, match="model"):
        load_variant(runtime, {"readme.txt": b""})


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bad_input_is_an_input_error(runtime, fp32_files) -> None:
    _runtime(runtime)
    model = load_variant(runtime, fp32_files(runtime))
    with pytest.raises(InferenceInputError):
        model.run({"nope": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(InferenceInputError):
        model.run({"image": np.zeros((1, 1, 8, 8), np.int64)})
    with pytest.raises(InferenceInputError):
        model.run({})  # a required input missing
    model.close()
