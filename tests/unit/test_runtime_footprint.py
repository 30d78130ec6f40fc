"""Runtime footprints from the profile's measured: section, against the board's budgets: a runtime
that does not fit is not planned (one line with the figures), and a variant's peak memory is
counted with its runtime's."""

from __future__ import annotations

from datetime import datetime, timezone

from edgesdk.converters.planner import make_plan
from edgesdk.converters.runtime_footprint import runtime_footprints, runtimes_that_do_not_fit

from edgesdk.profiles import get_profile
from edgesdk.schemas.common import ModelFormat, RuntimeName
from edgesdk.schemas.measurements import DeviceMeasurements, RuntimeFootprint, VariantMeasurement

ALL = (RuntimeName.ONNXRUNTIME, RuntimeName.LITERT, RuntimeName.OPENVINO)


def measured(device: str, *footprints: tuple[str, float, float | None], emulated: bool = False) -> DeviceMeasurements:
    return DeviceMeasurements(
        device_id=device, profile="p", machine="aarch64", emulated=emulated, model="digits", version="1.0.0",
        release=1, measured_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
        runtimes=[RuntimeFootprint(runtime=r, import_ms=1, rss_mb=rss, installed_mb=disk) for r, rss, disk in footprints],
        variants=[VariantMeasurement(variant="onnx-fp32", runtime="onnxruntime", precision="fp32", format="onnx",
                                     load_ms=1, rss_mb=1, warmup=1, runs=1, batch=1, p50_ms=1, p95_ms=1, mean_ms=1)],
        speed_ladder=["onnx-fp32"],
    )  # fmt: skip


def with_measured(name: str, *documents: DeviceMeasurements, **storage: float):
    profile = get_profile(name)
    return profile.model_copy(
        update={"measured": list(documents), "storage": profile.storage.model_copy(update=storage)}
    )


def test_the_largest_figures_of_any_device_count() -> None:
    profile = with_measured(
        "rpi5-8gb", measured("a", ("openvino", 60.0, 250.0)), measured("b", ("openvino", 75.0, None), emulated=True)
    )
    (openvino,) = runtime_footprints(profile).values()
    assert (openvino.rss_mb, openvino.installed_mb, openvino.devices) == (75.0, 250.0, 2)


def test_a_runtime_whose_import_takes_the_ram_budget_is_not_planned_with_the_figures() -> None:
    # rpi-zero-2w: 160 MB for a model. A runtime taking 170 MB at import leaves nothing.
    profile = with_measured("rpi-zero-2w", measured("z1", ("onnxruntime", 170.0, 90.0), ("litert", 12.0, 20.0)))
    refused, lines = runtimes_that_do_not_fit(profile)
    assert list(refused) == [RuntimeName.ONNXRUNTIME]
    assert refused[RuntimeName.ONNXRUNTIME] == (
        "runtime onnxruntime does not fit rpi-zero-2w: 170 MB RSS after import >= the model RAM budget 160 MB, "
        "before any model (90 MB installed, 170 MB RSS after import (measured on 1 device(s)))"
    )
    assert any(line.startswith("runtime litert on rpi-zero-2w: 20 MB installed") for line in lines)
    plan = make_plan(profile, "onnx", has_calibration=True, host_runtimes=ALL)
    assert all(v.runtime != RuntimeName.ONNXRUNTIME for v in plan.variants)
    onnx = [r for r in plan.rejected if r.format == ModelFormat.ONNX]
    assert onnx and all("does not fit rpi-zero-2w" in r.reason for r in onnx)


def test_runtimes_share_the_storage_left_for_them_in_the_profiles_order() -> None:
    # 300 MB for runtimes: litert (first) takes 20, onnxruntime 90, openvino's 250 no longer fits.
    profile = with_measured(
        "rpi5-8gb",
        measured("p1", ("litert", 10.0, 20.0), ("onnxruntime", 30.0, 90.0), ("openvino", 60.0, 250.0)),
        runtime_budget_mb=300,
    )
    refused, _ = runtimes_that_do_not_fit(profile)
    assert list(refused) == [RuntimeName.OPENVINO]
    assert "250 MB installed > 190 MB of runtime storage budget left for it" in refused[RuntimeName.OPENVINO]


def test_without_measured_footprints_nothing_is_refused() -> None:
    assert runtimes_that_do_not_fit(get_profile("rpi-zero-2w")) == ({}, [])


def test_a_variants_peak_memory_is_counted_with_its_runtimes() -> None:
    from types import SimpleNamespace

    from edgesdk.converters.pipeline import _apply_budgets
    from edgesdk.converters.planner import PlannedVariant

    from edgesdk.schemas.common import Precision

    profile = with_measured("rpi-zero-2w", measured("z1", ("onnxruntime", 70.0, 90.0)))  # 160 MB budget

    def built(peak: float) -> SimpleNamespace:
        planned = PlannedVariant("onnx", ModelFormat.ONNX, RuntimeName.ONNXRUNTIME, Precision.FP32)
        measurements = SimpleNamespace(peak_rss_mb=peak)
        return SimpleNamespace(
            planned=planned, artifact=SimpleNamespace(size=2**20), result=SimpleNamespace(measurements=measurements)
        )

    run = SimpleNamespace(rejected=[], decisions=[])
    fits, too_much = built(80.0), built(100.0)
    assert _apply_budgets(run, [fits], profile) == [fits]  # 80 + 70 <= 160
    assert _apply_budgets(run, [too_much], profile) == []  # 100 + 70 > 160, though 100 alone fits
    assert run.rejected[0].reason == (
        "fp32 dropped: peak memory 100 MB + 70 MB onnxruntime after import > RAM budget 160 MB"
    )
