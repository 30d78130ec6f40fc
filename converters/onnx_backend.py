"""ONNX: fp32 as exported, fp16 with onnxconverter-common, int8 with onnxruntime.quantization.

int8 comes as several recipes (``_INT8_BUILDERS``); converters/recipes.py says which ones suit
the model's family, and the pipeline measures each in onnxruntime and keeps the fastest that
holds the gate: static QDQ (min-max or percentile calibration, optionally after cross-layer
equalization) and NNCF QDQ for convnets; per-channel dynamic int8, weight-only MatMulNBits
and static QDQ of the weight MatMuls only for transformers. Dynamic int8 on a convnet lowers
convs to ConvInteger, which is slower than fp32 on x86.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.input_spec import InputLayout
from edgesdk.converters.planner import STATIC_INT8
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


#: float16's largest finite value.
FLOAT16_MAX = 65504.0


def nodes_beyond_float16(model: Any) -> list[str]:
    """Nodes fed a float initializer that float16 cannot hold (some |value| > 65504): fp16 keeps
    them in float32, as converted their weights would be clamped to 65504. paddle2onnx's text
    detector (PP-OCRv4) keeps a BatchNormalization whose running variance is ~1e7-1e8: clamped,
    its output came out tens of times too large and the fp16 map agreed with fp32 on 3.5 % IoU."""
    from onnx import TensorProto, numpy_helper

    too_large = {
        i.name
        for i in model.graph.initializer
        if i.data_type == TensorProto.FLOAT and np.abs(numpy_helper.to_array(i)).max(initial=0.0) > FLOAT16_MAX
    }
    return [n.name for n in model.graph.node if too_large.intersection(n.input)]


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
                too_large = nodes_beyond_float16(model)
                # 65504 is float16's largest finite value; the default clamps constants at 1e4
                # (a 16000 Hz sample rate silently became 10000).
                converted = float16.convert_float_to_float16(
                    model, keep_io_types=True, node_block_list=casts + too_large, max_finite_val=FLOAT16_MAX
                )
            except Exception as exc:  # noqa: BLE001
                raise ConversionError(
                    f"onnx fp16 conversion failed: {native_cause(str(exc) or type(exc).__name__, 'onnxconverter-common')}"
                ) from exc
            check_fp16_onnx(converted)
            onnx.save_model(converted, str(out))
            notes = (
                [f"kept in float32, their weights beyond float16's range: {', '.join(too_large)}"] if too_large else []
            )
            return ConvertedArtifact({"model.onnx": out}, Precision.FP16, "fp16-weights-and-activations", notes)
        if request.precision == Precision.INT8:
            return self._int8(request, out)
        raise ConversionError(f"onnx converter cannot make {request.precision.value}")

    def _int8(self, request: ConversionRequest, out: Path) -> ConvertedArtifact:
        method = request.method or "static-qdq-per-channel"
        keep = list(request.keep_float)
        build = _INT8_BUILDERS.get(method)
        if build is None:
            raise ConversionError(f"unknown onnx int8 method {method!r}; known: {', '.join(_INT8_BUILDERS)}")
        if method in _NEEDS_CALIBRATION and not request.calibration:
            raise ConversionError(f"onnx int8 ({method}) needs calibration data (--calibration)")
        try:
            build(_at_per_channel_opset(request), out, keep)
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime.quantization, NNCF and aimet raise many types
            raise ConversionError(
                f"onnx int8 ({method}) failed: {native_cause(str(exc), 'onnxruntime.quantization')}"
            ) from exc
        notes = [f"kept in float: {', '.join(keep)}"] if keep else []
        return ConvertedArtifact({"model.onnx": out}, Precision.INT8, method, notes)


#: DequantizeLinear takes a per-channel ``axis`` from opset 13 on; below it, a per-channel QDQ
#: model is invalid ("Unrecognized attribute: axis"), as paddle2onnx's opset 11/12 exports were.
PER_CHANNEL_OPSET = 13


def _at_per_channel_opset(request: ConversionRequest) -> ConversionRequest:
    """``request`` with its source raised to :data:`PER_CHANNEL_OPSET` when it is older (the
    upgraded copy in the build's workdir); the source is left as it is for every other variant."""
    source = at_per_channel_opset(request.source, request.workdir)
    return request if source is request.source else dataclasses.replace(request, source=source)


def at_per_channel_opset(source: SourceModel, workdir: Path) -> SourceModel:
    """``source`` raised to :data:`PER_CHANNEL_OPSET` when older (a copy in ``workdir``): every
    per-channel QDQ graph (the int8 builds and the sensitivity probe) is made from it."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(source.onnx_path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), PER_CHANNEL_OPSET)
    if opset >= PER_CHANNEL_OPSET:
        return source
    try:
        upgraded = version_converter.convert_version(model, PER_CHANNEL_OPSET)
    except Exception as exc:  # noqa: BLE001 - the version converter raises many types
        raise ConversionError(
            f"onnx int8 needs opset {PER_CHANNEL_OPSET} (per-channel DequantizeLinear); the model is opset {opset} "
            f"and onnx's version converter failed: {native_cause(str(exc), 'onnx.version_converter')}; "
            f"re-export it at opset {PER_CHANNEL_OPSET} or newer"
        ) from exc
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"source-opset{PER_CHANNEL_OPSET}.onnx"
    onnx.save_model(upgraded, str(path))
    return dataclasses.replace(source, onnx_path=path)


def _static(request: ConversionRequest, out: Path, keep: list[str], *, u8: bool = False, **options: Any) -> None:
    """ORT static QDQ, per-channel symmetric weights, asymmetric int8 (``u8``: uint8) activations."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    extra = {"ActivationSymmetric": False, "WeightSymmetric": True, **options.pop("extra_options", {})}
    quantize_static(
        str(request.source.onnx_path),
        str(out),
        _Calibration(request.calibration or {}, request.source.layout),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8 if u8 else QuantType.QInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=keep,
        extra_options=extra,
        **options,
    )


def _static_minmax(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    _static(request, out, keep)


def _static_percentile(request: ConversionRequest, out: Path, keep: list[str], u8: bool = False) -> None:
    from onnxruntime.quantization import CalibrationMethod

    # Min-max ranges are set by the rarest activations; 99.999 % clips them (measured on
    # MobileNetV2: the best of ORT's calibrations, see docs/converters.md).
    _static(request, out, keep, u8=u8, calibrate_method=CalibrationMethod.Percentile,
            extra_options={"CalibPercentile": 99.999})  # fmt: skip


# uint8 activations (U8S8): onnxruntime's x86 int8 kernels take uint8 activations; with int8
# ones (S8S8) they convert first. Measured on MobileNetV2, one thread, an AVX-512 VNNI host:
# 0.54x the fp32 latency with uint8 activations, 0.83x with int8, same agreement (BENCHMARKS.md,
# issue 17). On x86 *without* VNNI, U8S8 can saturate (vpmaddubsw): validation decides.
def _static_minmax_u8(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    _static(request, out, keep, u8=True)


def _static_percentile_u8(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    _static_percentile(request, out, keep, u8=True)


def _weight_matmuls(model: Any) -> tuple[list[str], list[str]]:
    """(MatMuls with an initializer weight, MatMuls of two activations) by node name."""
    weights = {i.name for i in model.graph.initializer}
    with_weight: list[str] = []
    without: list[str] = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.name:
            (with_weight if any(x in weights for x in node.input) else without).append(node.name)
    return with_weight, without


def _static_weight_matmuls(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    """Static QDQ of the weight MatMuls only: attention scores, Gather, LayerNorm and the
    residual stream stay float, and the MatMul outputs are not quantized (so a following
    Add/LayerNorm sees float)."""
    import onnx

    with_weight, activation = _weight_matmuls(onnx.load(str(request.source.onnx_path)))
    if not with_weight:
        raise ConversionError("static-qdq-weight-matmuls: the graph has no MatMul with a weight")
    _static(request, out, [*keep, *activation], op_types_to_quantize=["MatMul"],
            extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"],
                           "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1}})  # fmt: skip


_CLE_SCRIPT = """
import sys
import onnx
from aimet_onnx.cross_layer_equalization import equalize_model
model = onnx.load(sys.argv[1])
equalize_model(model)
onnx.save_model(model, sys.argv[2])
"""


def _cle_static(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    """Cross-layer equalization (aimet-onnx: BatchNorm folding, then per-channel rescaling of
    consecutive convs so their weight ranges match), then ORT static QDQ per-channel.

    aimet-onnx runs in a child process: importing it rebinds logging and the standard streams
    of the process (a later flush hit a closed file under pytest), and pulls a torchvision that
    does not import here; a child keeps all of that out of the converter."""
    import subprocess

    equalized = out.with_name("equalized.onnx")
    proc = subprocess.run(
        [sys.executable, "-c", _CLE_SCRIPT, str(request.source.onnx_path), str(equalized)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if proc.returncode != 0 or not equalized.exists():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConversionError(f"cross-layer equalization (aimet-onnx) failed: {tail}")
    # Node names survive equalization, so repair's keep_float still applies.
    _static(dataclasses.replace(request, source=dataclasses.replace(request.source, onnx_path=equalized)), out, keep)
    equalized.unlink()


def _dynamic(request: ConversionRequest, out: Path, keep: list[str], per_channel: bool = False) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(request.source.onnx_path), str(out), weight_type=QuantType.QInt8,
                     per_channel=per_channel, nodes_to_exclude=keep)  # fmt: skip


def _dynamic_per_channel(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    # Per-tensor weight scales lose the FFN output weights of transformers, whose outlier
    # columns are 18-42x the median; one scale per output channel keeps them.
    _dynamic(request, out, keep, per_channel=True)


def _weight_only(request: ConversionRequest, out: Path, keep: list[str]) -> None:
    """MatMulNBits: 8-bit weights in blocks of 128 along K; the rest of the graph stays float.

    accuracy_level 4 lets the kernel quantize each activation block to int8 at run time and use
    integer dot products: on this x86 host (MiniLM) 0.46x the fp32 latency at cosine 0.9992,
    where the default (fp32 compute, weights dequantized per call) was 4x *slower* than fp32.
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=128, is_symmetric=True, bits=8, accuracy_level=4)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(request.source.onnx_path)), bits=8, block_size=128,
                                     is_symmetric=True, accuracy_level=4, nodes_to_exclude=keep,
                                     algo_config=config)  # fmt: skip
    quantizer.process()
    if not any(n.op_type == "MatMulNBits" for n in quantizer.model.model.graph.node):
        raise ConversionError("weight-only-int8: no MatMul could take 8-bit block weights (K < 128?)")
    quantizer.model.save_model_to_file(str(out), use_external_data_format=False)


def _nncf(request: ConversionRequest, out: Path, keep: list[str]) -> None:
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
    onnx.save_model(quantized, str(out))


_INT8_BUILDERS: dict[str, Callable[[ConversionRequest, Path, list[str]], None]] = {
    "static-qdq-per-channel": _static_minmax,
    "static-qdq-percentile": _static_percentile,
    "static-qdq-u8": _static_minmax_u8,
    "static-qdq-percentile-u8": _static_percentile_u8,
    "static-qdq-weight-matmuls": _static_weight_matmuls,
    "cle-static-qdq": _cle_static,
    "nncf-qdq": _nncf,
    "dynamic-int8": _dynamic,
    "dynamic-int8-per-channel": _dynamic_per_channel,
    "weight-only-int8": _weight_only,
}
#: The planner's calibrated int8 methods (STATIC_INT8) that this backend builds.
_NEEDS_CALIBRATION = STATIC_INT8 & set(_INT8_BUILDERS)
