"""``--as-is``: a prebuilt artifact (``.onnx``, ``.tflite``, OpenVINO IR) shipped as it is.

No conversion: the file is one variant of its own format, at the precision found in it
(integer or Q/DQ ops → int8, float16 weights → fp16: :func:`prebuilt.native_precision`; a
.tflite storing fp16 weights for LiteRT to expand at load is fp32 on a profile without fp16),
validated where its runtime runs here (it loads and runs on the data, its latency and memory
measured, its outputs its own reference), then signed and packaged like any other variant.
The profile must run that format at that precision, or the plan says why not.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection

from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, ConverterCapabilities, SourceModel
from edgesdk.converters.planner import Plan, PlannedVariant
from edgesdk.converters.prebuilt import PREBUILT, native_precision, variant_files

from edgesdk.errors import UsageError
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.profile import DeviceProfile

#: The converter name of an as-is variant (not in the registry: it converts nothing).
AS_IS = "as-is"

_FORMAT_OF_KIND = {"onnx": ModelFormat.ONNX, "tflite": ModelFormat.TFLITE, "openvino": ModelFormat.OPENVINO}


def refuse_quantized_source(source: SourceModel) -> str:
    """The source kind for the planner; a prebuilt source that is already quantized cannot climb
    the fp32 → fp16 → int8 ladder (its "fp32" would be int8): it ships with --as-is."""
    if fp16_storage_only(source):
        return source.kind  # its fp32 is its fp16 weights dequantized (tflite_graph), the same values
    if source.kind in ("tflite", "openvino") and source.native_precision != Precision.FP32:
        raise UsageError(
            f"model {source.source} is already {source.native_precision.value}: there is no fp32 model to "
            "convert from; ship it as it is with --as-is"
        )
    return source.kind


def fp16_storage_only(source: SourceModel) -> bool:
    """A .tflite whose float16 tensors are all weights feeding Dequantize ops: LiteRT expands them
    to float32 at load and computes in fp32 (MediaPipe's models): fp16 storage, not fp16 compute."""
    if source.kind != "tflite" or source.native_precision != Precision.FP16:
        return False
    from edgesdk.converters.tflite_graph import fp16_content

    return fp16_content(source.onnx_path.read_bytes()).storage_only


def as_is_plan(profile: DeviceProfile, source: SourceModel, host_runtimes: Collection[RuntimeName]) -> Plan:
    """One variant: the source's format at its own precision, if the profile runs it."""
    plan = Plan()
    if source.kind == "pytorch":
        raise UsageError(f"--as-is ships a prebuilt file ({', '.join(PREBUILT)}); {source.source} is a PyTorch model")
    fmt = _FORMAT_OF_KIND[source.kind]
    files = variant_files(source)
    precision = native_precision(fmt, files) if source.kind == "onnx" else source.native_precision
    support = profile.runtime_for(fmt)
    if support is None:
        plan.reject(
            fmt,
            precision,
            f"{profile.name} does not run {fmt.value} (it runs {', '.join(f.value for f in profile.formats)})",
        )
        return plan
    if precision == Precision.FP16 and Precision.FP16 not in support.precisions and fp16_storage_only(source):
        precision = Precision.FP32
        plan.decisions.append(
            f"--as-is: {source.source} stores float16 weights that LiteRT expands to float32 at load: on "
            f"{profile.name}, whose {support.runtime.value} does not list fp16, it computes in fp32 and ships as fp32"
        )
    if precision not in support.precisions:
        plan.reject(fmt, precision, f"{support.runtime.value} on {profile.name} does not list {precision.value}")
        return plan
    runtime = RuntimeName.LITERT if support.runtime == RuntimeName.TFLITE_RUNTIME else support.runtime
    if runtime not in host_runtimes:
        plan.reject(
            fmt, precision, f"runtime {runtime.value} is not installed on this host, so the file cannot be validated"
        )
        return plan
    options = {"device": "CPU"} if runtime == RuntimeName.OPENVINO else {}
    if runtime == RuntimeName.OPENVINO and precision == Precision.FP32:
        options["INFERENCE_PRECISION_HINT"] = "f32"
    plan.variants.append(PlannedVariant(AS_IS, fmt, runtime, precision, (None,), options))
    plan.decisions.append(
        f"--as-is: {source.source} ships as {fmt.value}-{precision.value} (precision read from its ops), "
        f"validated in {runtime.value}"
    )
    return plan


def as_is_converter(planned: PlannedVariant) -> AsIsConverter:
    return AsIsConverter(planned.format, planned.runtime)


class AsIsConverter:
    """``--as-is``: the source's own files, copied, as one variant of its format and precision."""

    name = "as-is"

    def __init__(self, fmt: ModelFormat, runtime: RuntimeName) -> None:
        self.capabilities = ConverterCapabilities(
            format=fmt,
            runtime=runtime,
            precisions=(Precision.FP32, Precision.FP16, Precision.INT8),
            int8_methods=(),
            packages=(),
            extra="",
            sources=("onnx", "tflite", "openvino"),
        )

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        return []

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        request.workdir.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, path in variant_files(request.source).items():
            files[name] = request.workdir / name
            shutil.copyfile(path, files[name])
        return ConvertedArtifact(
            files,
            request.precision,
            "as-is",
            [f"shipped as given ({request.source.source}); validated against its own outputs in its runtime"],
        )
