"""TFLite / LiteRT: litert-torch from the PyTorch module, quantized with ai-edge-quantizer.

litert-torch's dynamic shapes do not lower our models (Flatten, Embedding: docs/converters.md),
so the artifact has the static shapes of the example input (batch 1; sequence models would
need one variant per length bucket). Tensor names follow the
model: the module is wrapped so the serving signature takes the inputs by name and returns
the outputs by name. int8 is either full-integer static (int8 I/O, with the quantization
parameters in the signature) or dynamic (int8 weights, float I/O).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from edgesdk.converters import onnx2tf_route
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.input_spec import InputLayout
from edgesdk.converters.quiet import quiet_native
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.toolchain_errors import native_cause

from edgesdk.errors import ConversionError, UnsupportedOpError
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


def _named_module(source: SourceModel) -> Any:
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

    return NamedIO(source.torch_module).eval()


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


#: Why a variant from a PyTorch module has static shapes (measured: docs/converters.md).
_NO_DYNAMIC_SHAPES = "litert-torch's dynamic shapes do not lower Flatten or Embedding"


class TFLiteConverter:
    name = "tflite"
    capabilities = CONVERTERS["tflite"].capabilities

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        return []

    def __init__(self) -> None:
        # One fp32 conversion per source serves fp32, fp16 and every int8 method.
        self._float_cache: dict[tuple[int, str], bytes] = {}

    def _float_model(self, source: SourceModel) -> bytes:
        key = (id(source.torch_module), str(source.onnx_path))
        if key not in self._float_cache:
            self._float_cache = {key: self._convert_float(source)}
        return self._float_cache[key]

    def _convert_float(self, source: SourceModel) -> bytes:
        if source.kind == "tflite":
            return source.onnx_path.read_bytes()  # a float .tflite source is its own fp32 model
        if source.torch_module is None:  # ONNX source: onnx2tf in its own venv (onnx2tf_route)
            return onnx2tf_route.convert_onnx(source.onnx_path, source.inputs, source.example, where=source.source)
        import litert_torch
        import torch

        sample = {k: torch.from_numpy(np.array(v)) for k, v in source.example.items()}
        try:
            with quiet_native():
                converted = litert_torch.convert(_named_module(source), sample_kwargs=sample)
        except Exception as exc:  # noqa: BLE001 - litert-torch raises many types
            first = native_cause(str(exc).strip() or type(exc).__name__, "litert-torch")
            # litert-torch defines no exception types (a failed lowering is a plain RuntimeError or
            # an MLIR diagnostic), so its message is the only signal; the matching stays here.
            if "lower" in first.lower() or "not supported" in first.lower() or "unsupported" in first.lower():
                raise UnsupportedOpError(f"tflite cannot express an op of {source.source}: {first}") from exc
            raise ConversionError(f"litert-torch conversion of {source.source} failed: {first}") from exc
        content: bytes = converted.model_content()
        return content

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        request.workdir.mkdir(parents=True, exist_ok=True)
        out = request.workdir / "model.tflite"
        fp32 = self._float_model(request.source)
        notes = (
            ["the source .tflite as given"]
            if request.source.kind == "tflite"
            else [
                "static shapes (batch 1): "
                + ("onnx2tf -ois" if request.source.torch_module is None else _NO_DYNAMIC_SHAPES)
            ]
        )
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
                content = self._quantize(fp32, recipe.static_wi8_ai8(), request.calibration, request.source.layout)
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
        self, model: bytes, recipe: Any, calibration: dict[str, np.ndarray] | Any, layout: InputLayout | None = None
    ) -> bytes:
        from ai_edge_quantizer import quantizer

        try:
            with quiet_native():
                q = quantizer.Quantizer(model)
                q.load_quantization_recipe(recipe)
                if q.need_calibration:
                    key = _signature_key(model)
                    samples = _as_signature_dtypes(model, key, (layout or InputLayout()).samples(calibration))
                    result = q.quantize(q.calibrate({key: samples}))  # type: ignore[union-attr]
                else:
                    result = q.quantize()
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConversionError(f"ai-edge-quantizer failed: {native_cause(str(exc), 'ai-edge-quantizer')}") from exc
        content: bytes = result.quantized_model
        return content
