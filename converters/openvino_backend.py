"""OpenVINO IR: ``convert_model`` from the ONNX export, fp16 by weight compression, int8 by NNCF.

int8 recipes (converters/recipes.py picks them by model family): NNCF post-training
quantization with the calibration data (default, full bias correction for convnets,
``ModelType.TRANSFORMER`` with SmoothQuant for transformers), NNCF's accuracy control (the
layers that cost the most agreement with fp32 *on the calibration samples* go back to float,
one at a time, until a bounded drop holds), or data-free int8 weight compression
(``compress_weights``). ``keep_float`` becomes NNCF's ``ignored_scope`` (the ONNX node names
survive conversion as OpenVINO friendly names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.toolchain_errors import native_cause

from edgesdk.errors import ConversionError, UnsupportedOpError
from edgesdk.schemas.common import Precision

if TYPE_CHECKING:
    from edgesdk.converters.validate import Metric

_QUANTIZABLE_TYPES = ("Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData")


def _read(source: SourceModel) -> object:
    import openvino as ov
    from openvino.frontend import NotImplementedFailure, OpConversionFailure

    try:
        if source.kind == "openvino":
            return ov.Core().read_model(str(source.onnx_path))  # an IR: read, not converted
        from edgesdk.converters.prebuilt import float_source  # a .tflite's fp16 weight storage expanded

        model = ov.convert_model(str(float_source(source)))  # ONNX, or .tflite through the TFLite frontend
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
        notes: list[str] = []
        ignored = nncf.IgnoredScope(names=keep, validate=False) if keep else None
        try:
            if method == "nncf-weights-int8":
                # Data-free: int8 weights, float activations (no calibration needed).
                quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM, ignored_scope=ignored)
            elif method == ACCURACY_CONTROL:
                if not request.calibration:
                    raise ConversionError(f"openvino int8 ({method}) needs calibration data (--calibration)")
                quantized, reverted = _accuracy_control(nncf, model, request, ignored)
                notes = [f"accuracy control on the calibration samples kept {reverted} op(s) in float"]
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
                known = ", ".join([*_PTQ_OPTIONS, ACCURACY_CONTROL, "nncf-weights-int8"])
                raise ConversionError(f"unknown openvino int8 method {method!r}; known: {known}")
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConversionError(f"NNCF quantization ({method}) failed: {native_cause(str(exc), 'NNCF')}") from exc
        if keep:
            notes.append(f"kept in float: {', '.join(request.keep_float)}")
        return quantized, method, notes


#: NNCF accuracy control: post-training quantization (fast bias correction), then the ops whose
#: int8 costs the most agreement with fp32 go back to float until the drop holds.
ACCURACY_CONTROL = "nncf-ptq-accuracy-control"
#: Its largest drop, measured on the *calibration* samples against the fp32 model (absolute): of
#: the share of samples on which every output holds its own metric ("top1"; "cosine" is kept for
#: callers of agreement_per_sample). Validation data never steers it.
ACCURACY_CONTROL_MAX_DROP = {"top1": 0.05, "cosine": 0.005}
#: At most this many ops go back to float (each is a ranking and a validation; past a few, the
#: float islands cost the int8 its speed: MobileNetV2 reverted 30 of 64 at a 0.03 drop, 0.83x fp32).
ACCURACY_CONTROL_MAX_REVERTS = 12


def agreement_per_sample(metric: Metric, outputs: Sequence[Any], reference: Sequence[Any]) -> list[float]:
    """Per sample (one output array each): 1.0/0.0 top-1 agreement, or the cosine of the
    flattened outputs (``validate.per_sample``, the gate's own metric)."""
    import numpy as np
    from edgesdk.converters.validate import per_sample

    if not outputs:
        return []

    def rows(arrays: Sequence[Any]) -> Any:
        return np.stack([np.asarray(a, np.float64).ravel() for a in arrays])

    return [float(v) for v in per_sample(metric, rows(outputs), rows(reference))]


def outputs_hold_per_sample(
    metrics: Mapping[str, Any], outputs: Sequence[Sequence[Any]], reference: Sequence[Sequence[Any]]
) -> list[float]:
    """Per sample (a list of output arrays each, in ``metrics``' order): 1.0 when every output
    holds its own metric's threshold (edgesdk.quality: top-1, cosine, error in the output's units,
    IoU, decoded text), else 0.0, so the accuracy control cannot trade a drifting landmark output
    for a classifier output that holds."""
    import numpy as np

    from edgesdk.quality.output_metrics import ERROR_KINDS, per_sample

    if not outputs:
        return []
    holds = np.ones(len(outputs), dtype=bool)
    for index, metric in enumerate(metrics.values()):
        got = np.stack([np.asarray(sample[index], np.float64) for sample in outputs])
        want = np.stack([np.asarray(sample[index], np.float64) for sample in reference])
        values = per_sample(metric, got, want)
        holds &= values <= metric.threshold if metric.kind in ERROR_KINDS else values >= metric.threshold
    return [float(h) for h in holds]


def _accuracy_control(nncf: Any, model: Any, request: ConversionRequest, ignored: Any) -> tuple[Any, int]:
    """``nncf.quantize_with_accuracy_control`` validated on the calibration samples (fp32 outputs
    of the same model as the reference), every output judged by its own metric: the share of
    samples on which all outputs hold theirs (outputs_hold_per_sample). (quantized model, ops kept in float)."""
    import numpy as np
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    from edgesdk.quality.output_metrics import resolve

    data = request.calibration or {}
    count = int(next(iter(data.values())).shape[0])
    items = list(request.source.layout.samples(data))
    reference = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = [o.name for o in request.source.outputs]

    def all_outputs(compiled: Any, item: Any) -> list[Any]:
        result = compiled(item)
        return [result[i] for i in range(len(names))]

    wanted = [all_outputs(reference, item) for item in items]
    chosen = resolve({n: np.stack([w[i] for w in wanted]) for i, n in enumerate(names)}, {})
    metrics = {n: (request.metrics or {}).get(n) or chosen[n] for n in names}

    def validate(compiled: Any, pairs: Any) -> tuple[float, list[float]]:
        pairs = list(pairs)
        got = [all_outputs(compiled, item) for item, _ in pairs]
        values = outputs_hold_per_sample(metrics, got, [wanted[i] for _, i in pairs])
        return float(sum(values) / max(len(values), 1)), values

    quantized = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(items), nncf.Dataset(list(zip(items, range(len(items)))), lambda pair: pair[0]),
        validate, max_drop=ACCURACY_CONTROL_MAX_DROP["top1"],
        subset_size=min(300, count), ignored_scope=ignored,
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
            max_num_iterations=ACCURACY_CONTROL_MAX_REVERTS
        ),
    )  # fmt: skip
    return quantized, float_weight_ops(quantized)


def float_weight_ops(model: Any) -> int:
    """Quantizable ops whose weights stayed float (no FakeQuantize on their weight input)."""
    count = 0
    for op in model.get_ops():
        if op.get_type_name() not in _QUANTIZABLE_TYPES:
            continue
        weight = op.input_value(1).get_node()
        while weight.get_type_name() in ("Convert", "Reshape", "Unsqueeze"):
            weight = weight.input_value(0).get_node()
        if weight.get_type_name() == "Constant" and weight.get_element_type().is_real():
            count += 1
    return count


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
