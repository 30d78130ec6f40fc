"""Rollback attacks against the real ``edge-agent install`` and ``edge-agent run``: the
anti-rollback floor holds when store.json or the floor record is damaged or gone, refuses
installs (and says so in /v1/status) when nothing can establish it, and lets through only a
signed downgrade for the device's floor that has not expired."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgesdk.bundle import package_bundle
from edgesdk.schemas.manifest import DowngradePermission
from tests.agent_helpers import PROFILE, AgentProcess, Device, make_device, run_agent_cli
from tests.conftest import assert_one_line_error

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")


FILES_OF_A_SLOT = ("committed", "bundle.edgepkg")


def install(device: Device, bundle: Path):
    return run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))


def installed(device: Device, bundle: Path) -> None:
    proc = install(device, bundle)
    assert proc.returncode == 0, proc.stderr


def assert_refused(proc, needle: str) -> None:
    """Refused with one error line naming why; the agent may also log what it found damaged
    (store.json unreadable) on the line before."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr


def downgrade(
    device: Device, convert_dir: Path, *, release: int, from_releases: tuple[int, int], expires_at: datetime, **kw
) -> Path:
    return package_bundle(
        convert_dir,
        name="digits",
        version=f"0.{release}.0",
        release=release,
        downgrade=DowngradePermission(from_releases=from_releases, expires_at=expires_at),
        publisher_key=device.publisher_key,
        recipients=[device.device_pub],
        targets=[PROFILE],
        out=device.root / f"downgrade-{release}-{from_releases[0]}-{from_releases[1]}.edgepkg",
        **kw,
    )


@pytest.fixture
def device_on_release_2(tmp_path, convert_dir):
    device = make_device(tmp_path / "dev")
    old = device.bundle(convert_dir, version="1.0.0", release=1)
    installed(device, old)
    installed(device, device.bundle(convert_dir, version="2.0.0", release=2))
    return device, old


def test_fresh_device_installs_its_first_release(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    assert not (device.model_dir() / "rollback_floor").exists()
    installed(device, device.bundle(convert_dir, version="1.0.0", release=1))
    assert (device.model_dir() / "rollback_floor").stat().st_size > 0  # the commit recorded the floor


def test_store_json_corrupted_then_older_release_is_refused(device_on_release_2) -> None:
    device, old = device_on_release_2
    (device.model_dir() / "store.json").write_text("{")
    assert_refused(install(device, old), "release 1 is below this device's rollback floor 2")


def test_store_json_deleted_then_older_release_is_refused(device_on_release_2) -> None:
    device, old = device_on_release_2
    (device.model_dir() / "store.json").unlink()
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")


def test_floor_file_deleted_the_slots_still_hold_the_floor(device_on_release_2) -> None:
    device, old = device_on_release_2
    (device.model_dir() / "rollback_floor").unlink()
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")
    # Two files gone (floor record and store.json): the slots' committed records still hold it.
    (device.model_dir() / "store.json").unlink()
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")


def test_every_record_in_the_model_dir_gone_the_security_state_still_holds_the_floor(
    device_on_release_2, convert_dir
) -> None:
    device, old = device_on_release_2
    for lost in ("rollback_floor", "store.json", "slots/a/committed", "slots/b/committed"):
        (device.model_dir() / lost).unlink()
    # The device's security state (agent/security_state.py) still says 2: older is refused,
    # newer installs.
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")
    installed(device, device.bundle(convert_dir, version="3.0.0", release=3))


@pytest.mark.parametrize("lost", ["models", "index, records and bundles"])
def test_models_dir_deleted_an_older_release_is_still_refused(device_on_release_2, convert_dir, lost) -> None:
    """Issue 37, finding 8: ``rm -rf data/models`` (or the records, the bundles and index.json)
    let release 1 install over a newer one; the floor is in the security state now."""
    device, old = device_on_release_2
    if lost == "models":
        shutil.rmtree(device.data_dir / "models")
    else:
        (device.data_dir / "models" / "index.json").unlink()
        for record in ("rollback_floor", "store.json", *(f"slots/{s}/{f}" for s in "ab" for f in FILES_OF_A_SLOT)):
            (device.model_dir() / record).unlink(missing_ok=True)
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")


@pytest.mark.parametrize("damage", ["deleted", "edited"])
def test_security_state_deleted_or_edited_installs_are_refused_and_reported(
    device_on_release_2, convert_dir, damage
) -> None:
    """The record deleted (the model's files kept), or its floor edited without the device key
    (the model's files gone): the device is tampered with, every install is refused, even a
    newer release, and /v1/status says why."""
    device, old = device_on_release_2
    state = device.data_dir / "security_state.json"
    if damage == "deleted":
        state.unlink()
    else:
        shutil.rmtree(device.data_dir / "models")
        document = json.loads(state.read_text())
        document["record"]["release_floors"]["digits"] = 0
        state.write_text(json.dumps(document))
    newer = device.bundle(convert_dir, version="3.0.0", release=3)
    for bundle in (old, newer):
        assert_refused(install(device, bundle), "edge-agent security-state seed")
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url) as client:
        status = client.get("/v1/status").json()
    assert status["security_state"]["tampered"] is True, status["security_state"]
    assert any(p.startswith("security state") for p in status["problems"]), status["problems"]


def test_everything_but_the_device_key_deleted_is_tampered_not_a_new_device(device_on_release_2) -> None:
    """The strict rule (issue 37): the record is made with the device key, so a data dir holding
    the key and nothing else was emptied, not new. Before, deleting the record together with
    every piece of state looked like a first start and release 1 installed over release 2."""
    device, old = device_on_release_2
    for path in device.data_dir.iterdir():
        if path.name not in ("device.key", "device.pub"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert_refused(install(device, old), "missing beside the device key")


def test_a_device_key_the_agent_makes_comes_with_its_record(tmp_path) -> None:
    from edgesdk.agent.security_state import SecurityState, state_key_provider

    device = make_device(tmp_path / "dev")
    for made in ("device.key", "device.pub", "security_state.json"):
        (device.data_dir / made).unlink()
    proc = run_agent_cli("key", "--config", str(device.config))
    assert proc.returncode == 0 and proc.stdout.startswith("key id: "), proc.stderr
    key = device.data_dir / "device.key"
    assert SecurityState(device.data_dir, state_key_provider(key, unseal="in_process")).open() == "ok"


def test_downgrade_outside_its_range_is_refused(device_on_release_2, convert_dir) -> None:
    device, _ = device_on_release_2
    later = datetime.now(timezone.utc) + timedelta(days=1)
    bundle = downgrade(device, convert_dir, release=1, from_releases=(3, 5), expires_at=later)
    assert_one_line_error(
        install(device, bundle), "downgrade permission covers floors 3-5, not this device's 2: downgrade refused"
    )


def test_expired_downgrade_is_refused(device_on_release_2, convert_dir) -> None:
    device, _ = device_on_release_2
    past = datetime.now(timezone.utc) - timedelta(days=10)
    bundle = downgrade(
        device, convert_dir, release=1, from_releases=(2, 2), expires_at=past + timedelta(days=1), now=past
    )
    assert_one_line_error(install(device, bundle), "downgrade permission expired at")


def test_downgrade_in_range_installs_and_the_next_normal_update_works(device_on_release_2, convert_dir) -> None:
    device, old = device_on_release_2
    installed(device, device.bundle(convert_dir, version="3.0.0", release=3))  # slots: b=2 → a=3
    later = datetime.now(timezone.utc) + timedelta(days=1)
    installed(device, downgrade(device, convert_dir, release=2, from_releases=(3, 3), expires_at=later))
    # The floor was lowered to 2 for this device: 1 is still refused, the next update is not.
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")
    installed(device, device.bundle(convert_dir, version="4.0.0", release=4))
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url) as client:
        status = client.get("/v1/status").json()
    assert status["model"]["release"] == 4 and not status["problems"], status


def test_seed_writes_the_record_from_the_files_once(device_on_release_2, convert_dir) -> None:
    """A data dir from an agent without a security state (or a tampered device, once an operator
    checked its files) is seeded with ``edge-agent security-state seed``: the floor comes from the
    files; a valid record is never replaced silently; a bad --floor is one error line."""
    device, old = device_on_release_2
    (device.data_dir / "security_state.json").unlink()
    assert_refused(install(device, old), "edge-agent security-state seed")
    proc = run_agent_cli("security-state", "seed", "--config", str(device.config))
    assert proc.returncode == 0 and "release floors digits=2" in proc.stdout, proc.stderr
    again = run_agent_cli("security-state", "seed", "--config", str(device.config))
    assert_one_line_error(again, "is present and valid; nothing to seed")
    bad = run_agent_cli(
        "security-state", "seed", "--config", str(device.config), "--floor", "digits", "--replace-valid"
    )
    assert_one_line_error(bad, "--floor 'digits' is not MODEL=RELEASE")
    assert_one_line_error(install(device, old), "release 1 is below this device's rollback floor 2")
    installed(device, device.bundle(convert_dir, version="3.0.0", release=3))
