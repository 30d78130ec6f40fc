"""OTA with the real agent parts in one process: real bundles (digits CNN), real SlotStore and
ModelServer, real verification and smoke test, real mosquitto, the real MQTT link and the real
fleet chunk server. The multi-process SIGKILL table is in test_ota_agent_process.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from edgesdk.agent.ota import UpdateManager, UpdateState

from edgesdk.schemas.messages import HealthCriteria, OtaStatus
from tests.agent_wiring_helpers import updater_for
from tests.faulty_agent import FaultPlan
from tests.ota_helpers import OtaBundles, StandInAgent, build_ota_bundles, make_deployment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("ota-bundles"))


class RecordingLink:
    """Records what the updater publishes; no broker (the MQTT path is tested further down)."""

    def __init__(self) -> None:
        self.published: list[OtaStatus] = []
        self.handlers: dict[str, list] = {}

    def subscribe(self, suffix, handler) -> None:
        self.handlers.setdefault(suffix, []).append(handler)

    def publish_reliable(self, suffix, model) -> int:
        assert suffix == "ota/status"
        self.published.append(model)
        return len(self.published)

    def publish_now(self, suffix, payload, qos=0) -> bool:
        return False


def fresh_agent(
    tmp_path: Path, bundles: OtaBundles, link=None, faults: FaultPlan | None = None
) -> tuple[StandInAgent, UpdateManager]:
    agent = StandInAgent(tmp_path / "agent", bundles, link=link)
    manager = updater_for(agent, hooks=faults)
    manager.resume()
    manager.wait_idle(30)
    return agent, manager


def test_sideload_then_local_update_then_refusals(tmp_path: Path, bundles: OtaBundles) -> None:
    link = RecordingLink()
    agent, manager = fresh_agent(tmp_path, bundles, link)
    assert manager.install_local(bundles.v1, timeout=60) is UpdateState.COMMITTED
    assert agent.server.running_model().release == 1
    assert manager.install_local(bundles.v2, timeout=60) is UpdateState.COMMITTED
    assert agent.server.running_model().release == 2
    assert agent.store.previous_slot is not None  # the old slot stays until overwritten
    for bad, needle in [
        (bundles.v1, "below this device's rollback floor"),  # rollback attack
        (bundles.v3_bad_golden, "golden"),  # smoke test
        (bundles.v4_other_profile, "rpi5-8gb"),  # other profile
        (bundles.v5_untrusted_signer, "unknown publisher"),  # bad signature
    ]:
        with pytest.raises(Exception, match=needle):
            manager.install_local(bad, timeout=60)
        assert agent.server.running_model().release == 2, bad
        last = link.published[-1]
        assert last.state == "FAILED" and needle in last.reason and last.model.release == 2
    assert not list((tmp_path / "agent").rglob("*.onnx")), "plaintext model on disk"


def test_probation_slo_breach_rolls_back_quickly(tmp_path: Path, bundles: OtaBundles) -> None:
    link = RecordingLink()
    agent, manager = fresh_agent(tmp_path, bundles, link)
    manager.install_local(bundles.v1, timeout=60)
    # An SLO no model can meet on this machine: p95 under 1 microsecond.
    deployment = make_deployment(
        bundles.v2, "dep-slo", bundles.operator_key, health=HealthCriteria(probation_s=30, p95_latency_ms=0.001)
    )
    agent.config.data_dir.joinpath("ota", "dep-slo.edgepkg").write_bytes(bundles.v2.read_bytes())
    deployment = deployment.model_copy(update={"chunk_sha256": []})  # served from the local copy
    manager.accept(deployment)
    assert manager.wait_idle(60)
    assert manager.state is UpdateState.ROLLED_BACK
    assert agent.server.running_model().release == 1
    states = [s.state for s in link.published if s.deployment_id == "dep-slo" and s.progress is None]
    assert states[-3:] == ["PROBATION", "ROLLING_BACK", "ROLLED_BACK"]
    assert "p95 latency" in link.published[-1].reason
    assert agent.store.committed and agent.store.installed_release() == 1


def test_device_keeps_serving_during_an_update(tmp_path: Path, bundles: OtaBundles) -> None:
    agent, manager = fresh_agent(tmp_path, bundles, RecordingLink())
    manager.install_local(bundles.v1, timeout=60)
    failures: list[BaseException] = []
    served: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                logits = agent.infer_once()
                assert logits.shape == (1, 10) and np.isfinite(logits).all()
                served.append(agent.server.running_model().release)
            except BaseException as exc:  # noqa: BLE001 - every failure counts
                failures.append(exc)

    threads = [threading.Thread(target=client) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        assert manager.install_local(bundles.v2, probation_s=1.0, timeout=60) is UpdateState.COMMITTED
        deadline = time.monotonic() + 60  # the clients answered by release 2 (a loaded machine runs them late)
        while 2 not in served and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert 1 in served and 2 in served


def test_disk_full_while_staging_keeps_the_old_model(tmp_path: Path, bundles: OtaBundles) -> None:
    """Disk full is simulated by an injected ENOSPC at the staging write (a FaultPlan passed to
    the manager): this machine has no small tmpfs to fill for real."""
    link = RecordingLink()
    faults = FaultPlan()
    agent, manager = fresh_agent(tmp_path, bundles, link, faults)
    manager.install_local(bundles.v1, timeout=60)
    faults.disk_full.add("stage")
    with pytest.raises(Exception, match="No space left"):
        manager.install_local(bundles.v2, timeout=60)
    assert agent.server.running_model().release == 1
    assert agent.store.installed_release() == 1 and agent.store.committed
    last = link.published[-1]
    assert last.state == "FAILED" and "No space left" in last.reason and last.model.release == 1
    assert not list((tmp_path / "agent" / "ota").glob("*.edgepkg")), "download leftovers not cleaned up"
    faults.disk_full.clear()
    assert manager.install_local(bundles.v2, timeout=60) is UpdateState.COMMITTED  # space is back: it works
