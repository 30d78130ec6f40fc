"""A pipeline rides over the air with its model (issue 42): release 2 of the digits bundle, the
same model with new labels in its signed pipeline, is pushed by the real rollout controller
through a real mosquitto to a real ``edge-agent run``; once the device commits, ``/predict``
answers a JPEG with release 2's labels — and before that, with release 1's. A release that
fails its probation is rolled back to the model in memory, pipeline included: /predict answers
through the whole rollback, with release 1's labels after it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, run_agent_cli
from tests.ota_helpers import PROFILE, Operator, OtaBundles, make_mqtt_device

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
pytest.importorskip("paho.mqtt")

pytestmark = pytest.mark.slow

LABELS_V1 = [f"digit-{i}" for i in range(10)]
LABELS_V2 = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PIPELINE_YAML = """\
input: image
image:
  color: L
  resize: {height: 8, width: 8, interpolation: bilinear}
  scale: 0.00392156862745098
  layout: NCHW
  max_pixels: 1000000
post:
  activation: softmax
  top_k: 1
"""


@pytest.fixture(scope="module")
def labelled_bundles(digits, tmp_path_factory) -> OtaBundles:
    """The OTA scenario's keys, with v1 and v2 the same model under two label sets."""
    from edgesdk.bundle import package_bundle
    from edgesdk.keys import generate_publisher_key
    from edgesdk.schemas.pipeline import load_pipeline
    from tests.bundle_helpers import make_digits_convert_dir, make_keys

    root = tmp_path_factory.mktemp("ota-pipeline-labels")
    keys = make_keys(root / "keys")
    operator_key, operator_pub = generate_publisher_key(root / "keys" / "operator")
    convert = make_digits_convert_dir(digits, root / "convert", profile=PROFILE, int8=False)
    (root / "pipeline.yaml").write_text(PIPELINE_YAML)

    def pack(version: str, release: int, labels: list[str]) -> Path:
        labels_file = root / f"labels-{release}.txt"
        labels_file.write_text("\n".join(labels) + "\n")
        return package_bundle(
            convert,
            name="digits",
            version=version,
            release=release,
            publisher_key=keys.publisher_key,
            recipients=[keys.device_pub],
            out=root / f"v{release}.edgepkg",
            pipeline=load_pipeline(root / "pipeline.yaml", labels_file),
        )

    v1, v2 = pack("1.0.0", 1, LABELS_V1), pack("1.1.0", 2, LABELS_V2)
    # Only these are pushed here; the other fields of the shared dataclass are not used.
    return OtaBundles(keys, operator_key, operator_pub, v1, v2, v1, v1, v1, extra={"v3": pack("1.2.0", 3, LABELS_V2)})


def _digit_jpeg(digits) -> bytes:
    """A real JPEG of a test digit, drawn 4x larger."""
    pixels = np.rint(np.load(digits.validation)["image"][0, 0] * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).resize((32, 32), Image.Resampling.NEAREST).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_an_ota_update_serves_the_new_bundles_labels_after_commit(
    tmp_path: Path, labelled_bundles: OtaBundles, digits, mqtt_broker
) -> None:
    from edgesdk.client import AgentClient

    device = make_mqtt_device(tmp_path / "device", labelled_bundles, mqtt_broker.url)
    installed = run_agent_cli("install", "--config", str(device.config), str(labelled_bundles.v1))
    assert installed.returncode == 0, installed.stderr
    jpeg = _digit_jpeg(digits)
    operator = Operator(tmp_path, labelled_bundles, mqtt_broker.url)
    try:
        with AgentProcess(device) as agent, AgentClient(agent.url) as client:
            before = client.predict("digits", jpeg)
            assert before["version"] == "1.0.0", before
            label = before["labels"][0]["label"]
            assert label in LABELS_V1, before
            deployment_id = operator.push(labelled_bundles.v2, HealthCriteria(probation_s=1))
            operator.thread.join(180)
            assert operator.device_row(deployment_id).state == "COMMITTED", agent.log()
            after = client.predict("digits", jpeg)
            assert after["version"] == "1.1.0", after
            # The same model, so the same class: named by release 2's labels now.
            assert after["labels"][0]["label"] == LABELS_V2[LABELS_V1.index(label)], after
    finally:
        operator.close()


def test_a_rolled_back_release_leaves_predict_answering_with_the_old_pipeline(
    tmp_path: Path, labelled_bundles: OtaBundles, digits, mqtt_broker
) -> None:
    """Rollback re-serves the previous model from memory: its pipeline must come back with it
    (it did not: /predict answered 404 "no pipeline in its bundle" after a rollback)."""
    import threading

    from edgesdk.client import AgentClient

    device = make_mqtt_device(tmp_path / "device", labelled_bundles, mqtt_broker.url)
    installed = run_agent_cli("install", "--config", str(device.config), str(labelled_bundles.v1))
    assert installed.returncode == 0, installed.stderr
    jpeg = _digit_jpeg(digits)
    operator = Operator(tmp_path, labelled_bundles, mqtt_broker.url)
    failures: list[str] = []
    try:
        with AgentProcess(device) as agent, AgentClient(agent.url) as client:
            label = client.predict("digits", jpeg)["labels"][0]["label"]
            # An SLO nothing meets: release 3 fails its probation on the traffic below.
            health = HealthCriteria(probation_s=3, p95_latency_ms=0.001)
            deployment_id = operator.push(labelled_bundles.extra["v3"], health)
            done = threading.Event()
            threading.Thread(target=lambda: (operator.thread.join(180), done.set()), daemon=True).start()
            while not done.wait(0.05):
                try:
                    client.predict("digits", jpeg)
                except Exception as exc:  # noqa: BLE001 - every failed request counts
                    failures.append(repr(exc))
            assert operator.device_row(deployment_id).state == "ROLLED_BACK", agent.log()
            after = client.predict("digits", jpeg)
            assert after["version"] == "1.0.0" and after["labels"][0]["label"] == label, after
    finally:
        operator.close()
    assert failures == []
