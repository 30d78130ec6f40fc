"""Drift on a real agent's own ``/metrics``, with no fleet (issue 41): an ``edge-agent run`` process
serving the digits CNN from a bundle whose signed reference profile was computed from its
validation data. Requests like that data score low on ``edgesdk_agent_drift_score`` (PSI, JS and
the binned KS); pixels x3 raise them above PSI 0.25 at the next scrape; NaN refusals and
out-of-range requests are counted; the page passes ``promtool check metrics``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgesdk.drift.profile import write_profile
from tests.agent_helpers import AgentProcess, make_device

httpx = pytest.importorskip("httpx")
ort = pytest.importorskip("onnxruntime")

SCORE = 'edgesdk_agent_drift_score{model="digits",direction="input",tensor="image",metric="%s"}'
REQUESTS = 'edgesdk_agent_drift_requests_total{model="digits",kind="%s"}'


def _profiled_convert_dir(digits: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The suite's cached digits convert dir, copied, with the validation data's reference profile."""
    from tests.bundle_helpers import make_digits_convert_dir

    cached = make_digits_convert_dir(
        digits, Path(request.config.cache.mkdir("edgesdk-agent-digits-convert-v1")) / "out"
    )
    convert = Path(shutil.copytree(cached, tmp_path / "convert"))
    images = np.load(digits.validation)["image"].astype(np.float32)
    session = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"image": images})[0]
    write_profile(convert, {"image": images}, {"logits": logits}, classify=True, plain=True)
    return convert


def _send(client: Any, images: np.ndarray, status: int = 200) -> None:
    for image in images:
        response = client.post(
            "/v1/models/digits/infer",
            content=np.ascontiguousarray(image[None], dtype="<f4").tobytes(),
            headers={"Content-Type": "application/x-edgesdk-tensors", "X-Tensors": "image=float32[1,1,8,8]"},
        )
        assert response.status_code == status, response.text


def _value(page: str, series: str) -> float | None:
    found = re.search(rf"^{re.escape(series)} (\S+)$", page, re.M)
    return float(found[1]) if found else None


def test_a_real_agent_without_a_fleet_shows_input_drift_and_quality_counts_on_its_metrics(
    digits: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    device = make_device(tmp_path / "device")
    device.install(_profiled_convert_dir(digits, request, tmp_path), name="digits")
    images = np.load(digits.calibration)["image"][:128].astype(np.float32)  # the validation data's distribution
    nan = images[:2].copy()
    nan[:, 0, 3, 3] = np.nan
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=60) as client:
        _send(client, images)
        calm = client.get("/metrics").text
        assert (_value(calm, SCORE % "psi") or 1) < 0.1 and (_value(calm, SCORE % "ks") or 1) < 0.1, calm
        assert _value(calm, REQUESTS % "out_of_range") == 0, calm

        _send(client, images * 3)  # drifted: the same window holds both halves, the scores still rise
        _send(client, nan, status=422)
        drifted = client.get("/metrics").text
        assert (_value(drifted, SCORE % "psi") or 0) > 0.25, drifted
        assert (_value(drifted, SCORE % "ks") or 0) > (_value(calm, SCORE % "ks") or 1), drifted
        assert _value(drifted, REQUESTS % "nonfinite") == 2, drifted
        assert (_value(drifted, REQUESTS % "out_of_range") or 0) > 0, drifted
        assert 'edgesdk_agent_drift_score{model="digits",direction="output",tensor="logits",metric="js"}' in drifted

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=drifted, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, f"promtool check metrics failed:\n{checked.stdout}{checked.stderr}\n---\n{drifted}"
