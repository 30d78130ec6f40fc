"""``edgesdk profiles import-measurements``: device figures into a profile's measured: section,
replacing an older entry of the same device, model and release; bad files are one clear line."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from edgesdk.profiles import get_profile
from edgesdk.schemas.measurements import DeviceMeasurements, VariantMeasurement
from tests.conftest import assert_one_line_error


def figures(tmp_path, name: str, *, device: str = "pi-1", release: int = 1, profile: str = "rpi5-8gb", p50=2.0):
    document = DeviceMeasurements(
        device_id=device, profile=profile, machine="aarch64", model="digits", version="1.0.0", release=release,
        measured_at=datetime.now(timezone.utc),
        variants=[
            VariantMeasurement(
                variant="onnx-fp32", runtime="onnxruntime", precision="fp32", format="onnx", load_ms=30.0,
                rss_mb=4.0, warmup=5, runs=50, batch=1, p50_ms=p50, p95_ms=p50 * 1.5, mean_ms=p50,
            )
        ],
        speed_ladder=["onnx-fp32"],
    )  # fmt: skip
    path = tmp_path / name
    path.write_text(document.model_dump_json())
    return path


def test_import_adds_then_replaces_the_same_device_model_and_release(tmp_path, edgesdk_cli) -> None:
    out = tmp_path / "profiles"
    first = edgesdk_cli("profiles", "import-measurements", str(figures(tmp_path, "a.json")), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert "1 in all" in first.stdout
    again = edgesdk_cli(
        "--profiles-dir", str(out), "profiles", "import-measurements",
        str(figures(tmp_path, "b.json", p50=3.0)), str(figures(tmp_path, "c.json", device="pi-2")), "--out", str(out),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    profile = get_profile("rpi5-8gb", [out])
    assert profile.extends is None  # standalone: the file is the whole profile
    measured = {(m.device_id, m.release): m.variants[0].p50_ms for m in profile.measured}
    assert measured == {("pi-1", 1): 3.0, ("pi-2", 1): 2.0}
    shown = edgesdk_cli("--profiles-dir", str(out), "profiles", "show", "rpi5-8gb", "--json")
    assert json.loads(shown.stdout)["measured"][0]["speed_ladder"] == ["onnx-fp32"]


def test_bad_files_are_one_line_errors(tmp_path, edgesdk_cli) -> None:
    out = str(tmp_path / "profiles")
    missing = edgesdk_cli("profiles", "import-measurements", str(tmp_path / "nope.json"), "--out", out)
    assert_one_line_error(missing, "nope.json", "cannot be read")
    (tmp_path / "bad.json").write_text('{"kind": "device-measurements"}')
    invalid = edgesdk_cli("profiles", "import-measurements", str(tmp_path / "bad.json"), "--out", out)
    assert_one_line_error(invalid, "bad.json")
    mixed = edgesdk_cli(
        "profiles", "import-measurements", str(figures(tmp_path, "p5.json")),
        str(figures(tmp_path, "p4.json", profile="rpi4-4gb")), "--out", out,
    )  # fmt: skip
    assert_one_line_error(mixed, "several profiles", "rpi4-4gb", "--profile")
