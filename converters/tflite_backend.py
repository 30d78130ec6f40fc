"""TFLite / LiteRT: litert-torch from the PyTorch module, quantized with ai-edge-quantizer.

litert-torch's dynamic shapes do not lower our models (Flatten, Embedding: docs/converters.md),
so the artifact has the static shapes of the example input (batch 1). A model with a named
sequence axis gets one signature per sequence bucket in the same file, weights shared
(edgesdk/runtimes/sequence_buckets.py; the runtime pads a request to the next bucket). Tensor names follow the
model: the module is wrapped so the serving signature takes the inputs by name and returns
the outputs by name. int8 is either full-integer static (int8 I/O, with the quantization
parameters in the signature) or dynamic (int8 weights, float I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from edgesdk.converters import onnx2tf_route, onnx2torch_route, tflite_graph
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.input_spec import InputLayout
from edgesdk.converters.quiet import quiet_native
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.toolchain_errors import native_cause, one_line

from edgesdk.errors import ConversionError, UnsupportedOpError
from edgesdk.runtimes.sequence_buckets import bucket_signature, choose_buckets, used_lengths
from edgesdk.schemas.common import Precision

SIGNATURE = "serving_default"

_FP16_RECIPE = [
    {
        "regex": ".*",
        "operation": "*",
        "algorithm_key": "float_casting",
        "op_config": {
            "weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
            "compute_precision": "FLOAT",
            "explicit_dequantize": True,
        },
    }
]


def _named_module(source: SourceModel, module: Any = None) -> Any:
    """``module`` (default: the source's) with its inputs by keyword and outputs as a dict."""
    import torch

    input_names = [s.name for s in source.inputs]
    output_names = [s.name for s in source.outputs]

    class NamedIO(torch.nn.Module):
        """Inputs by keyword, outputs as a dict: the .tflite signature then carries the names."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **feeds: torch.Tensor) -> dict[str, torch.Tensor]:
            out = self.inner(*(feeds[n] for n in input_names))
            if isinstance(out, dict):
                out = tuple(out.values())
            if not isinstance(out, (tuple, list)):
                out = (out,)
            return dict(zip(output_names, out))

    return NamedIO(source.torch_module if module is None else module).eval()


def _signature_key(model: bytes) -> str:
    """The model's serving signature (ours is serving_default; a prebuilt one names its own)."""
    from ai_edge_litert.interpreter import Interpreter

    return next(iter(Interpreter(model_content=model).get_signature_list()), SIGNATURE)


def _as_signature_dtypes(model: bytes, key: str, samples: Any) -> list[dict[str, np.ndarray]]:
    """Calibration samples in the dtypes of the model's signature: litert-torch turns int64
    inputs (token ids) into int32, and the quantizer's calibration refuses the data's int64 —
    the same cast validation makes before it runs a variant. Integers that do not fit are an error."""
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_content=model).get_signature_runner(key).get_input_details()
    wanted = {name: np.dtype(d["dtype"]) for name, d in details.items()}
    out = []
    for sample in samples:
        cast = {}
        for name, value in sample.items():
            value = np.asarray(value)
            dtype = wanted.get(name, value.dtype)
            if value.dtype != dtype and dtype.kind in "iu" and value.size:
                info = np.iinfo(dtype)
                if value.min() < info.min or value.max() > info.max:
                    raise ConversionError(
                        f"calibration input {name!r} has values outside {dtype.name}, the model's input type"
                    )
            cast[name] = value.astype(dtype, copy=False)
        out.append(cast)
    return out


@dataclass(frozen=True)
class _Buckets:
    """The sequence buckets of a conversion (edgesdk/runtimes/sequence_buckets.py)."""

    axes: dict[str, int] = field(default_factory=dict)  # input → sequence axis (model layout)
    lengths: tuple[int, ...] = ()  # the bucket lengths below the longest
    longest: int = 0
    why_not: str = ""  # when a sequence axis got no buckets: why (for the report)

    def fitting(self, samples: list[dict[str, np.ndarray]], length: int) -> list[dict[str, np.ndarray]]:
        """Calibration samples of one bucket: those that fit it, cut to its length (all, cut,
        when none fits: ranges from longer text beat no ranges)."""
        fit = [s for s in samples if int(used_lengths(s, self.axes)[0]) <= length] or samples
        return [{k: _cut(np.asarray(v), self.axes.get(k), length) for k, v in s.items()} for s in fit]

    def sentence(self) -> str:
        if not self.lengths:
            return self.why_not
        return (
            f"sequence buckets {', '.join(str(n) for n in self.lengths)} and {self.longest} (one signature each, "
            "weights shared; lengths at the 10th/50th/90th percentile of the calibration data's used lengths): "
            "the agent pads a request with zeros to the shortest that holds it"
        )


_NO_BUCKETS = _Buckets()


def _cut(value: np.ndarray, axis: int | None, length: int | None) -> np.ndarray:
    if axis is None or length is None:
        return value
    return np.ascontiguousarray(np.take(value, np.arange(length), axis=axis))


def sequence_axes(source: SourceModel) -> dict[str, int]:
    """Inputs with one named dynamic axis besides the batch (the same name for all: the
    sequence), when no output has that axis (its length would change with the bucket)."""
    if not source.layout.is_plain:
        return {}
    axes: dict[str, int] = {}
    names = set()
    for spec in source.inputs:
        dynamic = [axis for axis, dim in enumerate(spec.shape) if isinstance(dim, str) and axis != 0]
        if len(dynamic) > 1:
            return {}
        if dynamic:
            axes[spec.name] = dynamic[0]
            names.add(spec.shape[dynamic[0]])
    if len(names) != 1 or any(dim in names for spec in source.outputs for dim in spec.shape):
        return {}
    return axes


def plan_buckets(source: SourceModel, calibration: Any) -> _Buckets:
    """Bucket lengths from the calibration data's used lengths (never the validation data,
    which only measures); none without a sequence axis or data."""
    axes = sequence_axes(source)
    if not axes or not calibration or any(name not in calibration for name in axes):
        return _NO_BUCKETS
    name, axis = next(iter(axes.items()))
    longest = int(np.shape(source.example[name])[axis])
    used = used_lengths({n: np.asarray(calibration[n]) for n in axes}, axes)
    lengths = choose_buckets(used, longest)
    if not lengths:
        return _NO_BUCKETS
    try:
        max_diff = _pad_variance(source, calibration, axes, used, lengths[0])
    except Exception as exc:  # noqa: BLE001 - the user's module may refuse a shorter sequence in any way
        return _Buckets(why_not=f"static sequence length {longest}, no buckets: the model did not run cut to "
                        f"{lengths[0]} ({type(exc).__name__}: {one_line(str(exc))[:200]})")  # fmt: skip
    if max_diff is not None:
        return _Buckets(
            why_not=f"static sequence length {longest}, no buckets: zero padding changes this model's outputs "
            f"(max |diff| {max_diff:.3g} on calibration samples cut to {lengths[0]})"
        )
    return _Buckets(axes, tuple(lengths), longest)


def _pad_variance(
    source: SourceModel, calibration: Any, axes: dict[str, int], used: np.ndarray, length: int, count: int = 16
) -> float | None:
    """Buckets pad with zeros, which is right only for a model that masks them: run the PyTorch
    module on calibration samples that fit ``length`` at full length and cut to it; the largest
    difference when it is not within float noise, else None."""
    import torch

    chosen = np.flatnonzero(used <= length)[:count]
    if not len(chosen):
        return None
    names = [s.name for s in source.inputs]
    worst = 0.0
    with torch.no_grad():
        for index in chosen:
            full = {n: np.asarray(calibration[n][index : index + 1]) for n in names}
            cut = {n: _cut(v, axes.get(n), length) for n, v in full.items()}
            a, b = (_outputs(source.torch_module(*(torch.from_numpy(d[n]) for n in names))) for d in (full, cut))
            for x, y in zip(a, b):
                scale = 1.0 + float(np.abs(x).max())
                worst = max(worst, float(np.abs(x - y).max()) / scale)
    return worst if worst > 1e-4 else None


def _outputs(out: Any) -> list[np.ndarray]:
    if isinstance(out, dict):
        out = tuple(out.values())
    if not isinstance(out, (tuple, list)):
        out = (out,)
    return [np.asarray(o.detach().numpy(), dtype=np.float64) for o in out]


#: How the fp32 of a .tflite source with fp16 weight storage is made.
_DEQUANTIZED = (
    "the source .tflite with its float16 weights dequantized to float32 ahead of time, as LiteRT does at "
    "load (the same values: outputs bit-identical)"
)

#: Why a variant from a PyTorch module has static shapes (measured: docs/converters.md).
_NO_DYNAMIC_SHAPES = "litert-torch's dynamic shapes do not lower Flatten or Embedding"


class TFLiteConverter:
    name = "tflite"
    capabilities = CONVERTERS["tflite"].capabilities

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        return []

    def __init__(self) -> None:
        # One fp32 conversion per source serves fp32, fp16 and every int8 method.
        # (fp32 model, its sequence buckets, how it was made: the variant's first note)
        self._float_cache: dict[tuple[int, str], tuple[bytes, _Buckets, str]] = {}

    def _float_model(self, source: SourceModel, calibration: Any) -> tuple[bytes, _Buckets, str]:
        key = (id(source.torch_module), str(source.onnx_path))
        if key not in self._float_cache:
            self._float_cache = {key: self._convert_float(source, calibration)}
        return self._float_cache[key]

    def _convert_float(self, source: SourceModel, calibration: Any) -> tuple[bytes, _Buckets, str]:
        if source.kind == "tflite":
            # A float .tflite source is its own fp32 model; one storing fp16 weights for LiteRT
            # to expand at load (MediaPipe's) gets them expanded here, the same values.
            from edgesdk.converters.prebuilt import float_source

            start = float_source(source)
            made = _DEQUANTIZED if start != source.onnx_path else "the source .tflite as given"
            return start.read_bytes(), _NO_BUCKETS, made
        if source.torch_module is None:
            content, route = self._convert_onnx(source)
            return content, _NO_BUCKETS, f"static shapes (batch 1): {route}"
        import litert_torch
        import torch

        buckets = plan_buckets(source, calibration)
        module = _named_module(source)

        def sample(length: int | None = None) -> dict[str, Any]:
            return {
                k: torch.from_numpy(np.array(_cut(np.asarray(v), buckets.axes.get(k), length)))
                for k, v in source.example.items()
            }

        try:
            with quiet_native():
                if buckets.lengths:
                    # One signature per bucket in one model: the weights are stored once.
                    chain = litert_torch.signature(SIGNATURE, module, sample_kwargs=sample())
                    for length in buckets.lengths:
                        chain = chain.signature(bucket_signature(length), module, sample_kwargs=sample(length))
                    converted = chain.convert()
                else:
                    converted = litert_torch.convert(module, sample_kwargs=sample())
        except Exception as exc:  # noqa: BLE001 - litert-torch raises many types
            first = native_cause(str(exc).strip() or type(exc).__name__, "litert-torch")
            # litert-torch defines no exception types (a failed lowering is a plain RuntimeError or
            # an MLIR diagnostic), so its message is the only signal; the matching stays here.
            if "lower" in first.lower() or "not supported" in first.lower() or "unsupported" in first.lower():
                raise UnsupportedOpError(f"tflite cannot express an op of {source.source}: {first}") from exc
            raise ConversionError(f"litert-torch conversion of {source.source} failed: {first}") from exc
        content = bytes(converted.model_content())
        return content, buckets, f"static shapes (batch 1): {_NO_DYNAMIC_SHAPES}"

    def _convert_onnx(self, source: SourceModel) -> tuple[bytes, str]:
        """An ONNX source: onnx2torch then litert-torch (onnx2torch_route) when it is installed
        and maps the graph; else onnx2tf in its own venv (onnx2tf_route), the fallback."""
        light = onnx2torch_route.missing_reason()
        if light is None:
            try:
                return self._convert_onnx_light(source), "onnx2torch + litert-torch"
            except (ConversionError, UnsupportedOpError) as exc:
                light = str(exc)
        if onnx2tf_route.find_onnx2tf() is None:
            raise UnsupportedOpError(f"{light}; the fallback, onnx2tf, is not installed: {onnx2tf_route.INSTALL_HINT}")
        converted = onnx2tf_route.convert_onnx(source.onnx_path, source.inputs, source.example, where=source.source)
        return converted, "onnx2tf -ois"

    def _convert_onnx_light(self, source: SourceModel) -> bytes:
        import litert_torch
        import torch

        module = _named_module(source, onnx2torch_route.onnx_to_torch(source.onnx_path, where=source.source))
        example = {k: torch.from_numpy(np.array(v)) for k, v in source.example.items()}
        try:
            with quiet_native():
                converted = litert_torch.convert(module, sample_kwargs=example)
        except Exception as exc:  # noqa: BLE001 - torch.export and litert-torch raise many types
            cause = native_cause(str(exc).strip() or type(exc).__name__, "litert-torch")
            raise UnsupportedOpError(
                f"litert-torch cannot lower {source.source} as onnx2torch reads it: {cause}"
            ) from exc
        return bytes(converted.model_content())

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        request.workdir.mkdir(parents=True, exist_ok=True)
        out = request.workdir / "model.tflite"
        fp32, buckets, made = self._float_model(request.source, request.calibration)
        notes = [made]
        if buckets.sentence():
            notes.append(buckets.sentence())
        method: str | None = None
        if request.precision == Precision.FP32:
            content = fp32
        elif request.precision == Precision.FP16:
            content, method = self._quantize(fp32, _FP16_RECIPE, None), "fp16-weights"
        elif request.precision == Precision.INT8:
            from ai_edge_quantizer import recipe

            method = request.method or "static-int8-full-integer"
            if method == "static-int8-full-integer":
                if not request.calibration:
                    raise ConversionError("tflite full-integer int8 needs calibration data (--calibration)")
                content = self._quantize(
                    fp32, recipe.static_wi8_ai8(), request.calibration, request.source.layout, buckets
                )
                _require_symmetric_weights(content)
                notes.append("int8 inputs/outputs: quantize with the TensorSpec quantization parameters")
            elif method == "dynamic-int8":
                content = self._quantize(fp32, recipe.dynamic_wi8_afp32(), None)
            else:
                raise ConversionError(f"unknown tflite int8 method {method!r}; known: {self.capabilities.int8_methods}")
        else:
            raise ConversionError(f"tflite converter cannot make {request.precision.value}")
        out.write_bytes(content)
        return ConvertedArtifact({"model.tflite": out}, request.precision, method, notes)

    def _quantize(
        self,
        model: bytes,
        recipe: Any,
        calibration: dict[str, np.ndarray] | Any,
        layout: InputLayout | None = None,
        buckets: _Buckets | None = None,
    ) -> bytes:
        from ai_edge_quantizer import quantizer

        model = tflite_graph.with_signature(model)  # the quantizer runs signatures only (MediaPipe's have none)
        model = tflite_graph.with_builtin_codes(model)  # it reads op kinds from builtin_code only
        try:
            with quiet_native():
                q = quantizer.Quantizer(model)
                q.load_quantization_recipe(recipe)
                if q.need_calibration:
                    key = _signature_key(model)
                    samples = list((layout or InputLayout()).samples(calibration))
                    per_signature = {key: _as_signature_dtypes(model, key, samples)}
                    for length in (buckets or _NO_BUCKETS).lengths:
                        signature = bucket_signature(length)
                        fitting = (buckets or _NO_BUCKETS).fitting(samples, length)
                        per_signature[signature] = _as_signature_dtypes(model, signature, fitting)
                    result = q.quantize(q.calibrate(per_signature))  # type: ignore[union-attr]
                else:
                    result = q.quantize()
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConversionError(f"ai-edge-quantizer failed: {native_cause(str(exc), 'ai-edge-quantizer')}") from exc
        content: bytes = result.quantized_model
        return content


def _require_symmetric_weights(model: bytes) -> None:
    """One clear reason at build time, not a LiteRT load error later, when the quantizer gave a
    conv or fully-connected weight a zero point: TFLite's int8 spec needs them symmetric."""
    asymmetric = tflite_graph.asymmetric_int8_weights(model)
    if asymmetric:
        raise ConversionError(
            f"ai-edge-quantizer gave {len(asymmetric)} int8 weight(s) a zero point other than 0 (first: "
            f"{asymmetric[0]}); LiteRT's int8 conv and fully-connected kernels need symmetric weights and "
            "would refuse this model; use --int8-method dynamic-int8"
        )
