"""The speed gate: an int8 that is not faster than its fp32 is a size step, never a speed step."""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.converters.speed_gate import assign_roles

from edgesdk.profiles import get_profile
from edgesdk.schemas.common import ModelFormat, Precision


@dataclass
class Measured:
    format: ModelFormat
    precision: Precision
    latency_ms: float | None
    validated: bool = True
    ladder_role: str = "speed"
    latency_basis: str = ""


def test_slower_int8_is_size_only_and_faster_is_a_speed_step() -> None:
    onnx = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.INT8, 21.0)]
    openvino = [
        Measured(ModelFormat.OPENVINO, Precision.FP32, 10.0),
        Measured(ModelFormat.OPENVINO, Precision.INT8, 4.3),
        Measured(ModelFormat.OPENVINO, Precision.FP16, 9.8),  # within noise: not a step
    ]
    lines = assign_roles([*onnx, *openvino], get_profile("intel-nuc-core-ultra"), host="x86_64")
    assert [v.ladder_role for v in onnx] == ["reference", "size-only"]
    assert [v.ladder_role for v in openvino] == ["reference", "speed", "size-only"]
    assert any("onnx-int8: 2.10x" in line and "size step only" in line for line in lines)
    assert all("unverified" not in v.latency_basis for v in onnx + openvino)
    assert all(v.latency_basis.startswith("host timings (x86_64") for v in onnx + openvino)


def test_another_cpu_architecture_makes_the_ordering_unverified() -> None:
    variants = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.INT8, 5.0)]
    lines = assign_roles(variants, get_profile("rpi5-8gb"), host="x86_64")
    assert variants[1].ladder_role == "speed"
    assert all("unverified until measured on the device" in v.latency_basis for v in variants)
    assert any("rpi5-8gb is aarch64" in line for line in lines)


def test_an_unvalidated_variant_is_off_the_ladder() -> None:
    variants = [Measured(ModelFormat.COREML, Precision.FP16, None, validated=False)]
    lines = assign_roles(variants, get_profile("apple-m2-mac"), host="x86_64")
    assert variants[0].ladder_role == "off"
    assert any("never on the governor's ladder" in line for line in lines)


def test_fp16_timed_on_a_host_of_another_architecture_stays_a_step() -> None:
    # x86 emulates fp16; a Cortex-A76 runs it natively: the host timing cannot demote it.
    variants = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.FP16, 13.0),
                Measured(ModelFormat.ONNX, Precision.INT8, 20.0)]  # fmt: skip
    assign_roles(variants, get_profile("rpi5-8gb"), host="x86_64")
    assert [v.ladder_role for v in variants] == ["reference", "speed", "size-only"]
    assert "emulated" in variants[1].latency_basis and "unverified" in variants[1].latency_basis
