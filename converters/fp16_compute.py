"""An OpenVINO fp16 variant judged at fp16 compute, on a host whose CPU has none.

An fp16 IR (weights stored as f16) computes in f16 on a device with fp16 arithmetic: that is
OpenVINO's default on such an ARM CPU (a Pi 5's Cortex-A76). On an x86 host without it, the
CPU plugin runs the IR in bf16 when the CPU has AVX512-BF16 (an ``f16`` precision hint too:
measured here, OpenVINO 2026.4 on an AMD EPYC) and in f32 otherwise. Neither is the device's
arithmetic: bf16 keeps 8 significant bits where f16 keeps 11 (MediaPipe's pose_detection box
regressor: 94.6 px off in bf16, 2.46 px at f16, issue 38), and f32 hides f16's rounding.

So such a variant's accuracy is judged in f32 with every float activation rounded to f16's
11 significant bits (Veltkamp's split, ``t = x * 8193; x' = t - (t - x)``: OpenVINO folds a
``Convert`` f32 → f16 → f32 pair away, but not this arithmetic). f16's range (±65504) and its
subnormals are not reproduced. A host whose CPU lists FP16 runs the variant natively in f16.
The variant's latency and memory are still measured on the IR as built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: 2**(24 - 11) + 1: splits an f32 significand (24 bits) into its leading 11 (f16's) and the rest.
_VELTKAMP_F16 = np.float32(2**13 + 1)
#: Ops whose float outputs are not computed activations (the weights' own f16 is the variant's).
_NOT_ACTIVATIONS = frozenset({"Constant", "Parameter", "Result", "Convert", "ShapeOf"})
PRECISION_HINT = "INFERENCE_PRECISION_HINT"


def is_fp16_ir(runtime: str, blobs: Mapping[str, bytes], options: Mapping[str, str] | None) -> bool:
    """An OpenVINO IR with f16 weights and no precision pinned: the device computes it in f16.

    The converters pin ``f32`` for fp32 and int8 variants (int8 IR may carry f16 scales)."""
    if runtime != "openvino" or PRECISION_HINT in (options or {}) or _ir_file(blobs, ".bin") is None:
        return False
    import openvino as ov

    return any(
        op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.f16
        for op in _read(blobs).get_ordered_ops()
    )


def fp16_judged(
    blobs: Mapping[str, bytes], options: Mapping[str, str] | None
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The files and options that judge an fp16 IR at f16 compute on this host."""
    import openvino as ov

    if "FP16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return dict(blobs), {**(options or {}), PRECISION_HINT: "f16"}
    model = _read(blobs)
    round_activations_to_f16(model)
    return _serialized(model), {**(options or {}), PRECISION_HINT: "f32"}


def round_activations_to_f16(model: Any) -> int:
    """Round every float activation of ``model`` to f16's significand, in place; how many."""
    import openvino as ov
    import openvino.opset13 as ops

    rounded = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() in _NOT_ACTIVATIONS:
            continue
        for output in op.outputs():
            if output.get_element_type() != ov.Type.f32:
                continue
            consumers = list(output.get_target_inputs())
            scaled = ops.multiply(output, ops.constant(_VELTKAMP_F16))
            leading = ops.subtract(scaled, ops.subtract(scaled, output))
            for consumer in consumers:
                consumer.replace_source_output(leading.output(0))
            rounded += 1
    return rounded


def _read(blobs: Mapping[str, bytes]) -> Any:
    import openvino as ov

    weights = ov.Tensor(np.frombuffer(_ir_file(blobs, ".bin") or b"", dtype=np.uint8))
    return ov.Core().read_model(model=bytes(_ir_file(blobs, ".xml") or b""), weights=weights)


def _ir_file(blobs: Mapping[str, bytes], suffix: str) -> bytes | None:
    """The IR's .xml or .bin, whatever folder its key names (as load_variant accepts)."""
    return next((data for name, data in blobs.items() if name.endswith(suffix)), None)


def _serialized(model: Any) -> dict[str, bytes]:
    """``model`` as IR bytes (a temporary folder: OpenVINO serializes to paths only)."""
    import tempfile
    from pathlib import Path

    import openvino as ov

    with tempfile.TemporaryDirectory(prefix="edgesdk-fp16-") as folder:
        xml = Path(folder) / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        return {"model.xml": xml.read_bytes(), "model.bin": xml.with_suffix(".bin").read_bytes()}
