"""The same cases against every converter backend whose packages are installed (house style:
one shape for every backend). A backend that is not installed is a visible skip."""

from __future__ import annotations

import pytest
from edgesdk.converters.recipes import Family, recipes_for
from edgesdk.converters.registry import CONVERTERS, get_converter, missing_method_packages, missing_packages

from edgesdk.errors import ConversionError
from edgesdk.schemas.common import Precision

NAMES = list(CONVERTERS)


def _converter(name: str):
    missing = missing_packages(name)
    if missing:
        pytest.skip(
            f"converter {name!r} needs {', '.join(missing)} (pip install 'edgesdk[{CONVERTERS[name].capabilities.extra}]')"
        )
    return get_converter(name)


def _validate(name, artifact, source, validation, reference):
    from edgesdk.converters.coreml_backend import validate_spec
    from edgesdk.converters.validate import validate_numeric

    caps = CONVERTERS[name].capabilities
    if not caps.numeric_validation:
        return validate_spec(artifact, source)
    options = (
        {"INFERENCE_PRECISION_HINT": "f32"}
        if caps.runtime.value == "openvino" and artifact.precision == Precision.FP32
        else None
    )
    return validate_numeric(
        caps.runtime.value, artifact.files, validation, reference, metric="top1", gate=0.99, options=options
    )


@pytest.fixture(scope="module")
def built(digits_sources, tmp_path_factory):
    """Every installed backend's fp32, fp16 and int8 (each method) artifact of the digits CNN, built once."""
    from edgesdk.converters.base import ConversionRequest

    torch_source, _, calibration, _, _ = digits_sources
    cache: dict = {}

    def get(name: str, precision: Precision, method: str | None = None, keep_float: tuple[str, ...] = ()):
        key = (name, precision, method, keep_float)
        if key not in cache:
            converter = _converter(name)
            request = ConversionRequest(
                torch_source,
                precision,
                tmp_path_factory.mktemp(f"{name}-{precision.value}"),
                method=method,
                calibration=calibration,
                keep_float=keep_float,
            )
            cache[key] = converter.convert(request)
        return cache[key]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_backend_has_the_registered_shape(name) -> None:
    converter = _converter(name)
    assert converter.name == name
    assert converter.capabilities is CONVERTERS[name].capabilities
    assert set(converter.capabilities.precisions) >= {Precision.FP32}


@pytest.mark.parametrize("name", NAMES)
def test_fp32_matches_the_reference_in_the_device_runtime(name, built, digits_sources) -> None:
    from edgesdk.runtimes.registry import VARIANT_FILES

    source, _, _, validation, reference = digits_sources
    artifact = built(name, Precision.FP32)
    runtime = CONVERTERS[name].capabilities.runtime
    for expected in VARIANT_FILES[runtime]:
        assert any(f == expected or f.startswith(expected) for f in artifact.files), (expected, list(artifact.files))
    result = _validate(name, artifact, source, validation, reference)
    assert [s.name for s in result.inputs] == ["image"]
    assert [s.name for s in result.outputs] == ["logits"]
    if result.validation == "numeric":
        assert result.accuracy.value == 1.0
        assert result.accuracy.max_abs_diff["logits"] < 1e-3
        assert result.measurements.latency_p50_ms > 0
    else:
        assert result.accuracy is None and "unvalidated" in result.measurements.note


@pytest.mark.parametrize("name", NAMES)
def test_precision_ladder_shrinks_and_holds_the_gate(name, built, digits_sources) -> None:
    source, _, _, validation, reference = digits_sources
    caps = CONVERTERS[name].capabilities
    sizes = {p: built(name, p).size for p in (Precision.FP32, Precision.FP16)}
    assert sizes[Precision.FP16] < 0.6 * sizes[Precision.FP32]
    # The digits CNN is a convnet: its family's recipes (transformer recipes run on a transformer
    # in tests/integration/test_convert_multi_input.py).
    for method in recipes_for(name, Family.CONVNET, caps.int8_methods):
        if missing_method_packages(name, method):
            continue  # the planner skips it too (tests/unit/test_convert_planner.py)
        artifact = built(name, Precision.INT8, method)
        assert artifact.method == method
        assert artifact.size < sizes[Precision.FP16], method
        result = _validate(name, artifact, source, validation, reference)
        if result.validation == "numeric":
            assert result.accuracy.passed, (method, result.accuracy)


@pytest.mark.parametrize("name", NAMES)
def test_keep_float_keeps_layers_in_float(name, built, digits_sources) -> None:
    caps = CONVERTERS[name].capabilities
    if not caps.supports_repair:
        pytest.skip(f"{name} does not support per-layer repair")
    source = digits_sources[0]
    layers = _converter(name).quantizable_layers(source)
    assert "/7/Conv" in layers  # the 64×64×3×3 conv: most of the weights
    method = caps.int8_methods[0]
    full = built(name, Precision.INT8, method)
    partial = built(name, Precision.INT8, method, ("/7/Conv",))
    assert partial.size > full.size + 50_000  # ~37k weights kept in fp32


@pytest.mark.parametrize("name", NAMES)
def test_onnx_source_converts_or_is_refused_clearly(name, digits_sources, tmp_path) -> None:
    from edgesdk.converters.base import ConversionRequest
    from edgesdk.converters.planner import onnx_to_tflite_missing

    converter = _converter(name)
    _, onnx_source, _, _, _ = digits_sources
    request = ConversionRequest(onnx_source, Precision.FP32, tmp_path)
    if "onnx" in converter.capabilities.sources:
        missing = missing_packages(name, "onnx")
        if missing:
            pytest.skip(f"the ONNX route of {name} needs {', '.join(missing)}")
        if name == "tflite" and onnx_to_tflite_missing():  # onnx2torch (no-deps install) or onnx2tf's venv
            pytest.skip(onnx_to_tflite_missing())
        artifact = converter.convert(request)
        assert artifact.size > 0
        source, _, _, validation, reference = digits_sources
        result = _validate(name, artifact, onnx_source, validation, reference)
        assert [s.name for s in result.inputs] == ["image"]
    else:
        with pytest.raises(ConversionError, match="PyTorch model"):
            converter.convert(request)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_precision_or_method_is_an_error(name, digits_sources, tmp_path) -> None:
    from edgesdk.converters.base import ConversionRequest

    converter = _converter(name)
    source, _, calibration, _, _ = digits_sources
    with pytest.raises(ConversionError, match="bf16"):
        converter.convert(ConversionRequest(source, Precision.BF16, tmp_path / "a"))
    if len(converter.capabilities.int8_methods) > 1:
        with pytest.raises(ConversionError, match="no-such-method"):
            converter.convert(
                ConversionRequest(
                    source, Precision.INT8, tmp_path / "b", method="no-such-method", calibration=calibration
                )
            )
