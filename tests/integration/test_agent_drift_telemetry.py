"""Drift in telemetry, end to end (issue 41): ``edgesdk convert`` writes the validation data's
reference profile, ``edgesdk package`` signs it into the bundle, a real ``edge-agent run``
counts its answers into the profile's bins and reports PSI / Jensen-Shannon and data-quality
counts on MQTT. Requests like the validation data score low; a drifted stream (pixels x3, or
inverted) scores above PSI 0.25 in the next telemetry message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgesdk.drift.schema import PROFILE_FILE
from edgesdk.mqtt.broker import MosquittoBroker
from edgesdk.schemas.messages import ModelQuality, Telemetry
from tests.agent_helpers import AgentProcess, make_device
from tests.mqtt_helpers import Collector

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")
httpx = pytest.importorskip("httpx")

#: Telemetry windows with fewer answers are not judged (64 pixel values each: 20 is 1,280 values).
JUDGED = 20


def _send(url: str, images: np.ndarray, status: int = 200) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        for image in images:
            x = np.ascontiguousarray(image[None], dtype="<f4")
            response = http.post(
                "/v1/models/digits/infer",
                content=x.tobytes(),
                headers={"Content-Type": "application/x-edgesdk-tensors", "X-Tensors": "image=float32[1,1,8,8]"},
            )
            assert response.status_code == status, response.text


def _windows_after(observer: Collector, count: int, timeout: float = 120) -> list[ModelQuality]:
    """The quality figures of the telemetry messages after the first ``count``, once two more
    arrived after the requests were sent (the windows that hold them are reported by then; the
    tap may have sampled 1 in N of them)."""
    sent = _telemetry_count(observer)
    assert observer.wait_for(lambda: _telemetry_count(observer) >= sent + 2, timeout)
    found = []
    for message in observer.json("telemetry")[count:]:
        quality = Telemetry.model_validate(message).quality
        if quality is not None and quality.samples:
            found.append(quality)
    return found


def _judged(windows: list[ModelQuality]) -> list[ModelQuality]:
    judged = [q for q in windows if q.samples >= JUDGED]
    assert judged, windows
    return judged


def _telemetry_count(observer: Collector) -> int:
    return len(observer.json("telemetry"))


def test_drifted_inputs_raise_psi_in_the_next_telemetry(
    digits: Any, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    import edgesdk

    convert = tmp_path / "convert"
    edgesdk.convert(
        str(digits.onnx),
        "rpi5-8gb",
        out=convert,
        calibration=digits.calibration,
        validation=digits.validation,
        formats="onnx",
        precisions=["fp32"],
    )
    assert (convert / PROFILE_FILE).is_file()
    device = make_device(tmp_path / "device")
    device.write_config(mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 2.0})
    device.install(convert, name="digits")
    observer = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/telemetry")
    # Calibration images (each sent twice): the validation data's distribution, not its samples.
    images = np.tile(np.load(digits.calibration)["image"][:128].astype(np.float32), (2, 1, 1, 1))
    with AgentProcess(device) as agent:
        assert observer.wait_for(lambda: _telemetry_count(observer) >= 1, 120), agent.log()

        seen = _telemetry_count(observer)
        _send(agent.url, images)
        calm = _windows_after(observer, seen)
        for quality in _judged(calm):
            assert quality.reference and quality.out_of_range == 0, quality
            assert quality.inputs["image"].psi < 0.1, quality
        assert any("logits" in q.outputs and q.outputs["logits"].psi < 0.25 for q in calm), calm

        seen = _telemetry_count(observer)
        _send(agent.url, images * 3)
        scaled = _windows_after(observer, seen)
        for quality in _judged(scaled):
            assert quality.inputs["image"].psi > 0.25 and quality.out_of_range == quality.samples, quality

        seen = _telemetry_count(observer)
        nan = images[:2].copy()
        nan[:, 0, 3, 3] = np.nan
        _send(agent.url, 1 - images)  # inverted
        _send(agent.url, nan, status=422)  # and two refused for NaN
        inverted = _windows_after(observer, seen)
        for quality in _judged(inverted):
            assert quality.inputs["image"].psi > 0.25, quality
        reports = [Telemetry.model_validate(m) for m in observer.json("telemetry")[seen:]]
        assert sum(r.quality.nonfinite for r in reports if r.quality) == 2, [r.quality for r in reports]
        last = [r for r in reports if r.quality][-1]  # a report of an idle window carries no quality
        assert last.models and last.models[0].quality == last.quality
    observer.stop()


def test_edge_agent_install_refuses_a_bundle_with_an_oversized_profile_in_one_line(tmp_path: Path) -> None:
    import os

    from edgesdk.drift.profile import write_profile
    from edgesdk.keys import load_publisher_private_key
    from tests.agent_helpers import run_agent_cli
    from tests.bundle_helpers import resign_bundle, write_convert_dir
    from tests.conftest import assert_one_line_error

    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": os.urandom(1024)}})
    rng = np.random.default_rng(5)
    write_profile(convert, {"image": rng.random((32, 1, 8, 8))}, {}, classify=False, plain=True)
    device = make_device(tmp_path / "device")
    bundle = device.bundle(convert, version="1.0.0", release=1)

    def oversize(manifest: dict[str, Any]) -> None:
        tensor = manifest["reference"]["inputs"]["image"]
        manifest["reference"]["inputs"] = {
            f"in{i}": {**tensor, "histograms": tensor["histograms"] * 64} for i in range(8)
        }

    crafted = resign_bundle(
        bundle, tmp_path / "big.edgepkg", load_publisher_private_key(device.publisher_key), oversize
    )
    refused = run_agent_cli("install", "--config", str(device.config), str(crafted))
    assert_one_line_error(refused, "reference", "over 8192")
    assert not (device.model_dir() / "slots" / "a" / "bundle.edgepkg").exists()
