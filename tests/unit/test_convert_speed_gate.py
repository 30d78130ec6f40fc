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


def _with_measured(profile_name: str, *entries: dict) -> object:
    from datetime import datetime, timezone

    from edgesdk.schemas.measurements import DeviceMeasurements, VariantMeasurement

    profile = get_profile(profile_name)
    documents = []
    for i, entry in enumerate(entries):
        variants = [
            VariantMeasurement(
                variant=f"onnx-{precision}",
                runtime="onnxruntime",
                precision=precision,
                format="onnx",
                load_ms=1,
                rss_mb=1,
                warmup=1,
                runs=5,
                batch=1,
                p50_ms=ms,
                p95_ms=ms,
                mean_ms=ms,
            )  # fmt: skip
            for precision, ms in entry["p50"].items()
        ]
        documents.append(
            DeviceMeasurements(
                device_id=entry.get("device", f"pi-{i}"),
                profile=profile.name,
                machine="aarch64",
                emulated=entry.get("emulated", False),
                model=entry.get("model", "digits"),
                version="1.0.0",
                release=entry.get("release", 1),
                measured_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                variants=variants,
                speed_ladder=[v.variant for v in variants],
            )  # fmt: skip
        )
    return profile.model_copy(update={"measured": documents})


def test_the_devices_measured_figures_are_preferred_to_host_timings() -> None:
    # On this host int8 is 2x faster; on the two Pis that measured this model it is slower: not a step.
    profile = _with_measured(
        "rpi5-8gb", {"p50": {"fp32": 4.0, "int8": 4.4}}, {"p50": {"fp32": 5.0, "int8": 5.6}, "device": "pi-b"}
    )
    variants = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.INT8, 5.0)]
    lines = assign_roles(variants, profile, host="x86_64", model="digits")
    assert [v.ladder_role for v in variants] == ["reference", "size-only"]
    assert all(
        v.latency_basis.startswith("device timings: measured on 2 rpi5-8gb device(s) (pi-0, pi-b)") for v in variants
    )
    assert (
        lines[0].startswith("latency ordering from device timings") and "preferred to this host's timings" in lines[0]
    )
    assert not any("unverified" in line for line in lines)  # the devices measured it


def test_figures_of_another_model_or_from_emulation_leave_host_timings_in_charge() -> None:
    variants = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.INT8, 5.0)]
    other = _with_measured("rpi5-8gb", {"p50": {"fp32": 4.0, "int8": 9.0}, "model": "resnet"})
    lines = assign_roles(variants, other, host="x86_64", model="digits")
    assert variants[1].ladder_role == "speed" and variants[1].latency_basis.startswith("host timings")
    assert any("has no figures of digits (it has resnet)" in line for line in lines)
    emulated = _with_measured("rpi5-8gb", {"p50": {"fp32": 4.0, "int8": 9.0}, "emulated": True})
    lines = assign_roles(variants, emulated, host="x86_64", model="digits")
    assert variants[1].ladder_role == "speed" and any("only from emulation" in line for line in lines)


def test_the_newest_release_the_devices_measured_decides() -> None:
    profile = _with_measured(
        "rpi5-8gb", {"p50": {"fp32": 4.0, "int8": 9.0}, "release": 1}, {"p50": {"fp32": 4.0, "int8": 2.0}, "release": 2}
    )
    variants = [Measured(ModelFormat.ONNX, Precision.FP32, 10.0), Measured(ModelFormat.ONNX, Precision.INT8, 12.0)]
    assign_roles(variants, profile, host="aarch64", model="digits")
    assert variants[1].ladder_role == "speed" and "release 2" in variants[1].latency_basis
