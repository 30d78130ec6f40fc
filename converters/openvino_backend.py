"""OpenVINO IR: ``convert_model`` from the ONNX export, fp16 by weight compression, int8 by NNCF.

int8 recipes (converters/recipes.py picks them by model family): NNCF post-training
quantization with the calibration data (default, full bias correction for convnets,
``ModelType.TRANSFORMER`` with SmoothQuant for transformers) or data-free int8 weight
compression (``compress_weights``). ``keep_float`` becomes NNCF's
``ignored_scope`` (the ONNX node names survive conversion as OpenVINO friendly names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.toolchain_errors import native_cause

from edgesdk.errors import ConversionError, UnsupportedOpError
from edgesdk.schemas.common import Precision

_QUANTIZABLE_TYPES = ("Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData")


def _read(source: SourceModel) -> object:
    import openvino as ov
    from openvino.frontend import NotImplementedFailure, OpConversionFailure

    try:
        if source.kind == "openvino":
            return ov.Core().read_model(str(source.onnx_path))  # an IR: read, not converted
        model = ov.convert_model(str(source.onnx_path))  # ONNX, or .tflite through the TFLite frontend
        if source.kind == "tflite":
            _signature_names(model, source)
        return model
    except (OpConversionFailure, NotImplementedFailure) as exc:
        # The frontend's types for "an op did not convert". Its message opens with a C++
        # assertion; the op and the cause below it are what a user needs.
        raise UnsupportedOpError(
            f"openvino cannot convert an op of {source.source}: {native_cause(str(exc), 'OpenVINO')}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - OpenVINO's other errors share no base but Exception
        raise ConversionError(
            f"openvino convert_model failed on {source.source}: {native_cause(str(exc) or type(exc).__name__, 'OpenVINO')}"
        ) from exc


def _signature_names(model: Any, source: SourceModel) -> None:
    """Name the ports as the .tflite's serving signature does (the frontend uses tensor names)."""
    from edgesdk.converters.prebuilt import tflite_signature_names

    names = tflite_signature_names(source.onnx_path)
    for port in [*model.inputs, *model.outputs]:
        wanted = next((names[n] for n in port.get_names() if n in names), None)
        if wanted:
            port.get_tensor().set_names({wanted})


def _openvino_names(model: Any, onnx_names: Sequence[str]) -> list[str]:
    """ONNX node names → OpenVINO op names (a Conv with bias becomes ``<name>/WithoutBiases`` + Add)."""
    wanted = list(onnx_names)
    names: list[str] = []
    for op in model.get_ops():
        friendly = op.get_friendly_name()
        if op.get_type_name() in _QUANTIZABLE_TYPES and any(
            friendly == n or friendly.startswith(n + "/") for n in wanted
        ):
            names.append(friendly)
    return names


class OpenVINOConverter:
    name = "openvino"
    capabilities = CONVERTERS["openvino"].capabilities

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        """ONNX node names (the names repair uses everywhere) that have an int8-able OpenVINO op."""
        from edgesdk.converters.onnx_backend import onnx_quantizable_layers

        if source.kind not in ("onnx", "pytorch"):
            return []  # repair names ONNX nodes; a .tflite or IR source has none
        model = _read(source)
        return [n for n in onnx_quantizable_layers(source) if _openvino_names(model, [n])]

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        import openvino as ov

        request.workdir.mkdir(parents=True, exist_ok=True)
        xml = request.workdir / "model.xml"
        model = _read(request.source)
        method: str | None = None
        notes: list[str] = []
        if request.precision == Precision.INT8:
            model, method, notes = self._quantize(model, request)
        elif request.precision not in (Precision.FP32, Precision.FP16):
            raise ConversionError(f"openvino converter cannot make {request.precision.value}")
        # save_model compresses weights to fp16 by default; fp32 and int8 keep theirs.
        ov.save_model(model, str(xml), compress_to_fp16=request.precision == Precision.FP16)
        if request.precision == Precision.FP16:
            method = "fp16-weight-compression"
        return ConvertedArtifact(
            {"model.xml": xml, "model.bin": request.workdir / "model.bin"}, request.precision, method, notes
        )

    def _quantize(self, model: object, request: ConversionRequest) -> tuple[object, str, list[str]]:
        import nncf

        method = request.method or "nncf-ptq"
        keep = _openvino_names(model, request.keep_float)
        ignored = nncf.IgnoredScope(names=keep, validate=False) if keep else None
        try:
            if method == "nncf-weights-int8":
                # Data-free: int8 weights, float activations (no calibration needed).
                quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM, ignored_scope=ignored)
            elif method in _PTQ_OPTIONS:
                if not request.calibration:
                    raise ConversionError(f"openvino int8 ({method}) needs calibration data (--calibration)")
                data = request.calibration
                count = int(next(iter(data.values())).shape[0])
                items = list(request.source.layout.samples(data))
                quantized = nncf.quantize(
                    model, nncf.Dataset(items), subset_size=min(300, count), ignored_scope=ignored,
                    **_PTQ_OPTIONS[method](nncf),
                )  # fmt: skip
            else:
                known = ", ".join([*_PTQ_OPTIONS, "nncf-weights-int8"])
                raise ConversionError(f"unknown openvino int8 method {method!r}; known: {known}")
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConversionError(f"NNCF quantization ({method}) failed: {native_cause(str(exc), 'NNCF')}") from exc
        notes = [f"kept in float: {', '.join(request.keep_float)}"] if keep else []
        return quantized, method, notes


#: NNCF post-training recipes: method → nncf.quantize keyword arguments.
_PTQ_OPTIONS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "nncf-ptq": lambda nncf: {},
    # Full bias correction and asymmetric activations (mixed preset): the convnet recipe that
    # recovers MobileNetV2's depthwise blocks best among NNCF's options.
    "nncf-ptq-bias-correction": lambda nncf: {
        "fast_bias_correction": False,
        "preset": nncf.QuantizationPreset.MIXED,
    },
    # SmoothQuant and transformer-aware scopes (no quantizers on LayerNorm, Softmax inputs...).
    "nncf-ptq-transformer": lambda nncf: {"model_type": nncf.ModelType.TRANSFORMER},
}
