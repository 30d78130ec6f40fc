"""On-device profiling without a device: the speed ladder from measured figures, the timing loop
on a scripted clock, a variant that does not load, the saved figures, and the ladder the model
server builds from them."""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import count
from types import SimpleNamespace

import numpy as np
import pytest
from edgesdk.agent.profiling import (
    golden_feeds,
    load_measurements,
    load_saved,
    measure_runtime_imports,
    measure_variants,
    save,
    speed_ladder,
    time_runs,
)
from edgesdk.agent.serving import ModelServer

from edgesdk.errors import AgentError, RuntimeBackendError
from edgesdk.profiles import get_profile
from edgesdk.schemas.measurements import DeviceMeasurements, VariantMeasurement
from tests.unit.test_agent_serving import FakeModel, variant


def measured(vid: str, precision: str, p50: float, runtime: str = "onnxruntime") -> VariantMeasurement:
    return VariantMeasurement(
        variant=vid, runtime=runtime, precision=precision, format="onnx", load_ms=1.0, rss_mb=1.0,
        warmup=1, runs=10, batch=1, p50_ms=p50, p95_ms=p50 * 1.2, mean_ms=p50,
    )  # fmt: skip


def test_an_int8_slower_than_fp16_here_is_not_a_step() -> None:
    figures = [measured("fp32", "fp32", 4.0), measured("fp16", "fp16", 2.0), measured("int8", "int8", 3.0)]
    ladder, not_steps = speed_ladder(figures)
    assert ladder == ["fp32", "fp16"]
    assert "no faster than fp16" in not_steps["int8"] and "3.000 vs 2.000" in not_steps["int8"]


def test_the_fastest_runtime_represents_its_precision() -> None:
    figures = [
        measured("onnx-fp32", "fp32", 5.0),
        measured("openvino-fp32", "fp32", 3.0, runtime="openvino"),
        measured("onnx-int8", "int8", 1.0),
    ]
    ladder, not_steps = speed_ladder(figures)
    assert ladder == ["openvino-fp32", "onnx-int8"]
    assert not_steps["onnx-fp32"].startswith("slower than openvino-fp32 at fp32")


def test_time_runs_warms_up_untimed_then_times_each_run() -> None:
    ticks = count()
    calls: list[int] = []
    times = time_runs(lambda: calls.append(1), warmup=3, runs=4, clock=lambda: next(ticks) * 0.001)
    assert len(calls) == 7
    assert times == pytest.approx([1.0] * 4)  # each timed call spans exactly one tick of 1 ms


def test_measure_variants_times_each_and_reports_one_that_does_not_load() -> None:
    ticks = count()
    rss = iter([100.0, 103.5, 100.0, 100.0])

    def open_variant(vid: str) -> FakeModel:
        if vid == "broken":
            raise RuntimeBackendError("cannot parse")
        return FakeModel(2.0)

    feeds = golden_feeds({"x": np.ones((16, 4), np.float32), "output:y": np.ones((16, 4), np.float32)})
    assert feeds["x"].shape == (1, 4) and "output:y" not in feeds
    figures, failed = measure_variants(
        [variant("fp32", "fp32"), variant("broken", "int8")], open_variant, feeds,
        warmup=2, runs=5, rss_mb=lambda: next(rss), clock=lambda: next(ticks) * 0.001,
    )  # fmt: skip
    (fp32,) = figures
    assert (fp32.variant, fp32.runs, fp32.warmup, fp32.batch) == ("fp32", 5, 2, 1)
    assert fp32.rss_mb == pytest.approx(3.5)
    assert fp32.load_ms == pytest.approx(1.0) and fp32.p50_ms == pytest.approx(1.0)
    assert failed == {"broken": "does not load here: cannot parse"}


def test_golden_set_without_inputs_is_a_clear_error() -> None:
    with pytest.raises(AgentError, match="no inputs"):
        golden_feeds({"output:y": np.ones((1, 4))})


def device_measurements(ladder: list[str], release: int = 1) -> DeviceMeasurements:
    return DeviceMeasurements(
        device_id="dev-1", profile="rpi5-8gb", machine="aarch64", model="m", version="1.0.0", release=release,
        measured_at=datetime.now(timezone.utc),
        variants=[measured("fp32", "fp32", 4.0), measured("fp16", "fp16", 2.0), measured("int8", "int8", 3.0)],
        speed_ladder=ladder, not_steps={"int8": "int8 is no faster than fp16 on this device"},
    )  # fmt: skip


def test_saved_figures_round_trip_and_a_bad_file_is_ignored(tmp_path) -> None:
    assert load_measurements(tmp_path) is None and load_saved(tmp_path) is None
    save(tmp_path, device_measurements(["fp32", "fp16"]))
    assert load_measurements(tmp_path).speed_ladder == ["fp32", "fp16"]
    assert load_saved(tmp_path)["kind"] == "device-measurements"
    (tmp_path / "measurements.json").write_text('{"kind": "something else"}')
    assert load_measurements(tmp_path) is None


@pytest.mark.parametrize(
    ("release", "expected"),
    [(1, ["fp32", "fp16"]), (2, ["fp32", "fp16", "int8"])],  # figures of another release do not apply
)
def test_the_server_loads_only_the_measured_steps_of_the_same_model(monkeypatch, release, expected) -> None:
    import edgesdk.runtimes as runtimes

    monkeypatch.setattr(runtimes, "load_variant", lambda runtime, files, options=None, execution=None: FakeModel(1.0))
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=release),
        variants=[variant("fp32", "fp32"), variant("fp16", "fp16"), variant("int8", "int8")],
    )
    server = ModelServer(profile=get_profile("rpi5-8gb"), measured=lambda: device_measurements(["fp32", "fp16"]))
    model = server.swap(
        SimpleNamespace(manifest=manifest, sha256="b" * 64), "key", decrypt=lambda b, vid, key: {"model.onnx": b""}
    )
    assert [v.id for v in model.ladder] == expected


def test_runtime_imports_are_measured_once_each_and_a_missing_one_is_skipped() -> None:
    imported: list[str] = []
    ticks = count()
    rss = iter([10.0, 60.0, 60.0])

    def fake_import(module: str) -> object:
        if module == "openvino":
            raise ImportError("No module named 'openvino'")
        imported.append(module)
        return object()

    footprints = measure_runtime_imports(
        ["onnxruntime", "onnxruntime", "openvino", "coreml"], rss_mb=lambda: next(rss),
        clock=lambda: next(ticks) * 0.5, import_module=fake_import, disk_mb=lambda runtime: 42.5,
    )  # fmt: skip
    assert imported == ["onnxruntime"]  # once; coreml has no module to time here
    (ort,) = footprints
    assert (ort.runtime, ort.import_ms, ort.rss_mb, ort.installed_mb) == ("onnxruntime", 500.0, 50.0, 42.5)


def test_installed_size_is_the_distribution_files_and_none_when_not_installed() -> None:
    from edgesdk.agent.profiling import installed_mb

    pytest.importorskip("onnxruntime")
    assert installed_mb("onnxruntime") > 1  # the wheel's native library alone is tens of MB
    assert installed_mb("coreml") is None  # no distribution to measure


def test_saved_figures_are_read_again_only_when_the_file_changes(tmp_path) -> None:
    import os

    from edgesdk.agent.profiling import SavedMeasurements

    saved = SavedMeasurements(tmp_path)
    assert saved.current() is None
    save(tmp_path, device_measurements(["fp32", "fp16"]))
    first = saved.current()
    assert first is not None and saved.current() is first  # not parsed again
    save(tmp_path, device_measurements(["fp32"]))
    os.utime(tmp_path / "measurements.json", ns=(1, 1))  # a rewrite within the clock's resolution
    assert saved.current().speed_ladder == ["fp32"]


def test_telemetry_carries_the_measured_summary(tmp_path) -> None:
    from edgesdk.agent.metrics import Metrics

    from edgesdk.schemas.messages import Telemetry

    figures = device_measurements(["fp32", "fp16"])
    snapshot = Metrics(measured=lambda: figures).snapshot()
    telemetry = Telemetry(device_id="d", msg_id="m", seq=0, ts=datetime.now(timezone.utc), **snapshot)
    assert telemetry.measured is not None
    assert telemetry.measured.p50_ms == {"fp32": 4.0, "fp16": 2.0, "int8": 3.0}
    assert telemetry.measured.speed_ladder == ["fp32", "fp16"] and telemetry.measured.release == figures.release
    assert Metrics().snapshot()["measured"] is None
