"""Shadow agreement through real processes (issue 41): a real agent (``edge-agent run``), a real
mosquitto, ``edgesdk fleet push --min-agreement 0.9`` as a subprocess, and a client sending real
digits images over HTTP during probation.

The wrong v2 is fast and self-consistent: the digits CNN with two rows of its last layer swapped
(classes 3 and 5: an honest "wrong checkpoint"), converted and packaged like any release, so its
golden outputs, its accuracy gate and its smoke test all pass. Only the comparison with v1 on the
device's own traffic can tell. The faithful v2 is v1 re-packaged: it commits.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, run_agent_cli
from tests.ota_helpers import PROFILE, OtaBundles, build_ota_bundles, make_mqtt_device

pytestmark = pytest.mark.slow

SWAPPED = (3, 5)


def swap_last_layer_rows(onnx_path: Path, out: Path) -> Path:
    """The model with classes SWAPPED exchanged in its final Gemm's weight rows and bias."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    last = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
    for init in model.graph.initializer:
        if init.name in last.input[1:3]:
            array = numpy_helper.to_array(init).copy()
            array[list(SWAPPED)] = array[list(reversed(SWAPPED))]
            init.CopyFrom(numpy_helper.from_array(array, init.name))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    from edgesdk.bundle import package_bundle
    from tests.bundle_helpers import make_digits_convert_dir

    root = tmp_path_factory.mktemp("ota-shadow-bundles")
    built = build_ota_bundles(digits, root)
    wrong = dataclasses.replace(digits, onnx=swap_last_layer_rows(digits.onnx, root / "digits-swapped.onnx"))
    convert = make_digits_convert_dir(wrong, root / "convert-swapped", profile=PROFILE, int8=False)
    built.extra["v2_swapped"] = package_bundle(
        convert,
        name="digits",
        version="1.1.0",
        release=2,
        publisher_key=built.keys.publisher_key,
        recipients=[built.keys.device_pub],
        out=root / "v2-swapped.edgepkg",
    )
    return built


class Client(threading.Thread):
    """Posts the validation images, one per request, until stopped (the device's live traffic)."""

    def __init__(self, url: str, images: np.ndarray) -> None:
        super().__init__(daemon=True)
        self.url, self.images = url + "/v1/models/digits/infer", images
        self.answered = 0
        self.failures: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            image = self.images[self.answered % len(self.images)]
            body = json.dumps({"inputs": {"image": image[None].tolist()}}).encode()
            request = urllib.request.Request(self.url, data=body, headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
            except OSError as exc:
                self.failures.append(str(exc))
                continue  # the swap itself may refuse a request for an instant: keep the traffic going
            self.answered += 1
            time.sleep(0.004)  # ~200 requests a second: traffic, not a load test (CI has 2 cores)


def test_shadow_agreement_rolls_back_a_fast_wrong_canary_and_commits_a_faithful_v2(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, edgesdk_cli, digits
) -> None:
    """One device under live traffic (v1 installed): the wrong v2 is rolled back for agreement and
    its rollout aborts; then v1 re-packaged as v2 commits, the agreement in its probation line."""
    device = make_mqtt_device(tmp_path / "device", bundles, mqtt_broker.url)
    installed = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
    assert installed.returncode == 0, installed.stderr
    agent = AgentProcess(device).start()
    client = Client(agent.url, np.load(digits.validation)["image"].astype(np.float32))
    client.start()

    def push(bundle: Path) -> tuple[str, int, dict]:
        done = edgesdk_cli(
            "fleet", "push", str(bundle), "--devices", "dev-1", "--canary", "100%", "--waves", "100%",
            "--max-failures", "0%", "--probation", "3s", "--min-agreement", "0.9", "--shadow-rate", "100%",
            "--expires", "30m", "--broker", mqtt_broker.url, "--operator-key", str(bundles.operator_key),
            "--db", str(tmp_path / "fleet.sqlite3"),
        )  # fmt: skip
        with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
            return done.stdout + done.stderr, done.returncode, json.loads(response.read())

    try:
        output, code, status = push(bundles.extra["v2_swapped"])
        assert code != 0, output + agent.log()[-3000:]
        assert "aborted" in output and "shadow agreement 0." in output, output
        assert "< 0.9 (logits: top1 against release 1)" in output, output
        assert status["model"]["release"] == 1 and status["updates"]["state"] == "ROLLED_BACK"  # v1 serves again
        answered = client.answered

        output, code, status = push(bundles.v2)
        assert code == 0, output + agent.log()[-3000:]
        assert status["model"]["release"] == 2 and status["updates"]["state"] == "COMMITTED"
        reason = status["updates"]["reason"]
        assert reason.startswith("probation passed:"), reason
        pattern = r"; shadow agreement 1\.00 \(lower bound (0\.9\d|1\.00) over \d+ requests; logits: top1"
        assert re.search(pattern, reason), reason
        assert answered > 30 and client.answered > answered, client.failures[-3:]
    finally:
        client.stopped.set()
        client.join(15)
        agent.stop()


def test_after_a_restart_in_probation_the_shadow_loads_the_previous_slot_within_the_memory_budget(
    tmp_path: Path, bundles: OtaBundles, digits
) -> None:
    """Real store, bundles, opener and ModelServer.swap, in process: with nothing of v1 loaded
    (as after a restart in probation) the shadow verifies and decrypts the previous slot in memory
    when it fits the free budget, and loads nothing when it does not."""
    from edgesdk.agent.shadow.reference import ShadowDevice

    from edgesdk.bundle import inspect_bundle
    from edgesdk.schemas.messages import HealthCriteria
    from tests.agent_wiring_helpers import updater_for
    from tests.ota_helpers import StandInAgent

    agent = StandInAgent(tmp_path / "dev", bundles)
    manager = updater_for(agent)
    manager.install_local(bundles.v1, timeout=60)
    manager.install_local(bundles.v2, timeout=60)
    target = manager.target
    assert target._previous_model is None and agent.store.previous_slot is not None
    target._manifest = inspect_bundle(bundles.v2).manifest  # what activation reads from the new slot
    deployment = manager.machine.record.deployment.model_copy(
        update={"health": HealthCriteria(min_agreement=0.9, shadow_rate=1.0)}
    )

    target.shadow_device = ShadowDevice(free_mb=lambda: 0.01, pressure=lambda: None)
    refused = target._start_shadow(deployment)
    assert refused.runner is None and "MB to load and the model memory budget has 0.0 MB free" in (refused.absent or "")

    target.shadow_device = ShadowDevice(free_mb=lambda: 1000.0, pressure=lambda: None)
    check = target._start_shadow(deployment)
    try:
        assert check.runner is not None and check.reference_release == 1
        assert check.runner.reference.model.release == 1 and agent.server.model.release == 2
        images = np.load(digits.validation)["image"][:40].astype(np.float32)
        for done, image in enumerate(images, start=1):  # one at a time: the queue never drops here
            feeds = {"image": image[None]}
            agent.server.tap("digits", feeds, agent.server.infer("digits", feeds), "onnx-fp32")
            deadline = time.monotonic() + 60
            while check.runner.compared < done and time.monotonic() < deadline:
                time.sleep(0.005)
        assert check.breach(final=True) is None, check.summary()
        assert check.summary().startswith("shadow agreement 1.00 (lower bound 0.9"), check.summary()
    finally:
        check.stop()
    assert agent.server.taps == []  # the tap is gone with the probation
