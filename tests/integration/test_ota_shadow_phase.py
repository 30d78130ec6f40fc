"""The shadow phase before activation through real processes (issue 41): a real agent with v1
under live HTTP traffic, a real mosquitto, ``edgesdk fleet push --shadow-for 3s --min-agreement
0.9`` as a subprocess. The fast, wrong v2 (two classes swapped: the fixtures of
test_ota_shadow_agreement.py) is refused in its shadow phase, and no client ever got its answer."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, run_agent_cli
from tests.integration.test_ota_shadow_agreement import Client, bundles  # noqa: F401 - the module fixture
from tests.ota_helpers import OtaBundles, make_mqtt_device

pytestmark = pytest.mark.slow


class VersionClient(Client):
    """The live traffic, remembering which model version answered each request."""

    def __init__(self, url: str, images: np.ndarray) -> None:
        super().__init__(url, images)
        self.versions: set[str] = set()

    def run(self) -> None:
        while not self.stopped.is_set():
            image = self.images[self.answered % len(self.images)]
            body = json.dumps({"inputs": {"image": image[None].tolist()}}).encode()
            request = urllib.request.Request(self.url, data=body, headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    self.versions.add(str(json.loads(response.read()).get("version")))
            except OSError as exc:
                self.failures.append(str(exc))
                continue
            self.answered += 1
            self.stopped.wait(0.004)


def test_shadow_phase_refuses_a_fast_wrong_v2_before_activation_while_v1_answers_everyone(
    tmp_path: Path,
    bundles: OtaBundles,  # noqa: F811 - the imported module fixture
    mqtt_broker,
    edgesdk_cli,
    digits,
) -> None:
    device = make_mqtt_device(tmp_path / "device", bundles, mqtt_broker.url)
    installed = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
    assert installed.returncode == 0, installed.stderr
    agent = AgentProcess(device).start()
    client = VersionClient(agent.url, np.load(digits.validation)["image"].astype(np.float32))
    client.start()
    try:
        done = edgesdk_cli(
            "fleet", "push", str(bundles.extra["v2_swapped"]), "--devices", "dev-1", "--canary", "100%",
            "--waves", "100%", "--max-failures", "0%", "--probation", "3s", "--shadow-for", "3s",
            "--min-agreement", "0.9", "--shadow-rate", "100%", "--expires", "30m", "--broker", mqtt_broker.url,
            "--operator-key", str(bundles.operator_key), "--db", str(tmp_path / "fleet.sqlite3"),
        )  # fmt: skip
        output = done.stdout + done.stderr
        with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
            status = json.loads(response.read())
        assert done.returncode != 0, output + agent.log()[-3000:]
        assert "aborted" in output and "shadow phase: shadow agreement 0." in output, output
        assert "< 0.9 (logits: top1 against release 1)" in output, output
        assert status["updates"]["state"] == "FAILED" and status["model"]["release"] == 1
        assert client.answered > 30, client.failures[-3:]
    finally:
        client.stopped.set()
        client.join(15)
        agent.stop()
    assert client.versions == {"1.0.0"}, client.versions  # the wrong v2 answered nobody
