"""ONNX: fp32 as exported, fp16 with onnxconverter-common, int8 with onnxruntime.quantization.

int8 comes two ways, and the pipeline measures both in onnxruntime and keeps the faster one
that holds the gate: static QDQ, per-channel, calibrated (conv nets), and dynamic int8
(transformer/linear-heavy models; on x86 it lowers convs to ConvInteger, which can be slower
than fp32).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping

import numpy as np
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.input_spec import InputLayout
from edgesdk.converters.precision_check import check_fp16_onnx
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.toolchain_errors import native_cause

from edgesdk.errors import ConversionError
from edgesdk.schemas.common import Precision

#: Ops whose weights int8 quantizes, and which keep_float can keep in float.
QUANTIZABLE_OPS = ("Conv", "Gemm", "MatMul", "ConvTranspose")


def onnx_quantizable_layers(source: SourceModel) -> list[str]:
    """Names of the ONNX nodes int8 quantizes: the common currency of accuracy-aware repair."""
    import onnx

    model = onnx.load(str(source.onnx_path))
    return [n.name for n in model.graph.node if n.op_type in QUANTIZABLE_OPS and n.name]


class _Calibration:
    """onnxruntime CalibrationDataReader over in-memory arrays, one sample per call."""

    def __init__(self, data: Mapping[str, np.ndarray], layout: InputLayout) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(list(layout.samples(data)))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


class OnnxConverter:
    name = "onnx"
    capabilities = CONVERTERS["onnx"].capabilities

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        return onnx_quantizable_layers(source)

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        out = request.workdir / "model.onnx"
        request.workdir.mkdir(parents=True, exist_ok=True)
        if request.precision == Precision.FP32:
            shutil.copyfile(request.source.onnx_path, out)
            return ConvertedArtifact({"model.onnx": out}, Precision.FP32, None)
        if request.precision == Precision.FP16:
            import onnx
            from onnxconverter_common import float16

            model = onnx.load(str(request.source.onnx_path))
            try:
                # keep_io_types: callers feed and read float32 whatever the precision inside.
                # Casts stay in fp32: the converter retypes their outputs but not their `to`
                # attribute (int64 mask → float Cast then fails to load); it bridges them instead.
                # The converter keys nodes by name: unnamed ones collide (an AttributeError deep
                # inside it), so every node gets one first.
                for index, node in enumerate(model.graph.node):
                    node.name = node.name or f"{node.op_type}_{index}"
                casts = [n.name for n in model.graph.node if n.op_type == "Cast"]
                # 65504 is float16's largest finite value; the default clamps constants at 1e4
                # (a 16000 Hz sample rate silently became 10000).
                converted = float16.convert_float_to_float16(
                    model, keep_io_types=True, node_block_list=casts, max_finite_val=65504.0
                )
            except Exception as exc:  # noqa: BLE001
                raise ConversionError(
                    f"onnx fp16 conversion failed: {native_cause(str(exc) or type(exc).__name__, 'onnxconverter-common')}"
                ) from exc
            check_fp16_onnx(converted)
            onnx.save_model(converted, str(out))
            return ConvertedArtifact({"model.onnx": out}, Precision.FP16, "fp16-weights-and-activations")
        if request.precision == Precision.INT8:
            return self._int8(request, out)
        raise ConversionError(f"onnx converter cannot make {request.precision.value}")

    def _int8(self, request: ConversionRequest, out: object) -> ConvertedArtifact:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        method = request.method or "static-qdq-per-channel"
        keep = list(request.keep_float)
        source = str(request.source.onnx_path)
        try:
            if method == "static-qdq-per-channel":
                if not request.calibration:
                    raise ConversionError("onnx static int8 needs calibration data (--calibration)")
                quantize_static(
                    source,
                    str(out),
                    _Calibration(request.calibration, request.source.layout),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=keep,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
                )
            elif method == "nncf-qdq":
                if not request.calibration:
                    raise ConversionError("onnx nncf-qdq int8 needs calibration data (--calibration)")
                self._nncf(request, str(out), keep)
            elif method == "dynamic-int8":
                quantize_dynamic(source, str(out), weight_type=QuantType.QInt8, nodes_to_exclude=keep)
            else:
                raise ConversionError(f"unknown onnx int8 method {method!r}; known: {self.capabilities.int8_methods}")
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime.quantization raises many types
            raise ConversionError(
                f"onnx int8 ({method}) failed: {native_cause(str(exc), 'onnxruntime.quantization')}"
            ) from exc
        notes = [f"kept in float: {', '.join(keep)}"] if keep else []
        return ConvertedArtifact({"model.onnx": request.workdir / "model.onnx"}, Precision.INT8, method, notes)

    @staticmethod
    def _nncf(request: ConversionRequest, out: str, keep: list[str]) -> None:
        """NNCF post-training quantization on the ONNX graph (QDQ, run by onnxruntime)."""
        import nncf
        import onnx

        data = request.calibration or {}
        count = int(next(iter(data.values())).shape[0])
        items = list(request.source.layout.samples(data))
        quantized = nncf.quantize(
            onnx.load(str(request.source.onnx_path)),
            nncf.Dataset(items),
            subset_size=min(300, count),
            ignored_scope=nncf.IgnoredScope(names=keep, validate=False) if keep else None,
        )
        onnx.save_model(quantized, out)
