"""SlotStore: A/B slots of encrypted bundles, atomic state, fallback to the last good slot.
Verification is faked here (the real verify_bundle runs in the integration tests)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from edgesdk.agent.slot_store import SlotStore

from edgesdk.errors import AgentError, IntegrityError, SignatureError


@dataclass
class FakeVerified:
    path: Path
    sha256: str
    manifest: object


def fake_bundle(tmp_path: Path, name: str, release: int, content: bytes | None = None) -> FakeVerified:
    path = tmp_path / f"{name}-{release}.edgepkg"
    path.write_bytes(content or f"ENCRYPTED {name} {release}".encode())
    manifest = SimpleNamespace(model=SimpleNamespace(name=name, version=f"{release}.0.0", release=release))
    return FakeVerified(path, hashlib.sha256(path.read_bytes()).hexdigest(), manifest)


def fake_verify(path: Path, **_: object) -> FakeVerified:
    """Accepts a file unless it contains BROKEN; reads name/release from its content."""
    data = path.read_bytes()
    if b"BROKEN" in data:
        raise SignatureError(f"{path}: signature invalid")
    _, name, release = data.decode().split()
    manifest = SimpleNamespace(model=SimpleNamespace(name=name, version=f"{release}.0.0", release=int(release)))
    return FakeVerified(path, hashlib.sha256(data).hexdigest(), manifest)


def install(store: SlotStore, verified: FakeVerified) -> str:
    slot = store.stage(verified)
    store.activate(slot)
    store.commit()
    return slot


def test_stage_activate_commit_alternate_slots(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    assert store.active_slot is None and store.installed_release() is None
    assert install(store, fake_bundle(tmp_path, "m", 1)) == "a"
    assert install(store, fake_bundle(tmp_path, "m", 2)) == "b"
    assert (store.active_slot, store.previous_slot, store.installed_release()) == ("b", "a", 2)
    # The next stage goes to the non-active slot, replacing the oldest, never the one serving.
    assert store.stage(fake_bundle(tmp_path, "m", 3)) == "a"
    assert store.active_slot == "b"
    assert store.previous_slot is None  # slot a no longer holds release 1
    assert store.bundle_path("b").read_bytes() == b"ENCRYPTED m 2"


def test_state_is_persisted_and_reread(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    again = SlotStore(tmp_path / "data", verify=fake_verify)
    assert again.active_slot == "a" and again.committed and again.installed_release() == 1
    state = json.loads((tmp_path / "data" / "store.json").read_text())
    assert state["slots"]["a"]["good"] is True
    assert not list((tmp_path / "data").glob(".*tmp*"))  # no temporary files left behind


def test_stage_refuses_a_file_changed_after_verification(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    verified = fake_bundle(tmp_path, "m", 1)
    verified.path.write_bytes(b"ENCRYPTED m 666")  # swapped on disk after verify
    with pytest.raises(IntegrityError, match="changed after it was verified"):
        store.stage(verified)
    assert store.active_slot is None
    assert not store.bundle_path("a").exists()


def test_rollback_goes_to_previous_good_slot(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    slot = store.stage(fake_bundle(tmp_path, "m", 2))
    store.activate(slot)
    assert not store.committed
    assert store.rollback() == "a"
    assert (store.active_slot, store.previous_slot, store.installed_release()) == ("a", None, 1)
    assert store.rollback() is None  # nothing further back


def test_rollback_without_a_good_previous_is_refused(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    store.activate(store.stage(fake_bundle(tmp_path, "m", 1)))
    assert store.rollback() is None
    assert store.active_slot == "a"


def test_activate_unknown_or_empty_slot(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    with pytest.raises(AgentError, match="unknown slot 'c'"):
        store.activate("c")  # type: ignore[arg-type]
    with pytest.raises(AgentError, match="no staged bundle"):
        store.activate("b")
    with pytest.raises(AgentError, match="nothing to commit"):
        store.commit()


def test_load_active_falls_back_to_last_good_and_reports(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    install(store, fake_bundle(tmp_path, "m", 2))
    store.bundle_path("b").write_bytes(b"BROKEN")  # the active slot rots on the SD card
    verified = store.load_active(trusted_publishers=[], profile="rpi5-8gb")
    assert verified.manifest.model.release == 1
    assert store.load_report["fell_back"] is True and store.load_report["slot"] == "a"
    assert "slot b" in store.load_report["problems"][0] and "signature invalid" in store.load_report["problems"][0]
    # Persisted: the good slot is active, so the next install stages over the broken one.
    again = SlotStore(tmp_path / "data", verify=fake_verify)
    assert again.active_slot == "a" and again.stage(fake_bundle(tmp_path, "m", 3)) == "b"


def test_load_active_detects_a_swapped_slot_file(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    install(store, fake_bundle(tmp_path, "m", 2))
    store.bundle_path("b").write_bytes(b"ENCRYPTED m 9")  # validly signed, but not what was installed
    verified = store.load_active(trusted_publishers=[], profile="rpi5-8gb")
    assert verified.manifest.model.release == 1
    assert "is not the one installed" in store.load_report["problems"][0]


def test_load_active_with_nothing_usable(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    assert store.load_active([], "p") is None
    install(store, fake_bundle(tmp_path, "m", 1))
    store.bundle_path("a").unlink()
    assert store.load_active([], "p") is None
    assert "missing" in store.load_report["problems"][0]


def test_unreadable_state_file_means_empty_store(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "store.json").write_text("{not json")
    store = SlotStore(data, verify=fake_verify)
    assert store.active_slot is None


def test_start_up_reopens_a_slot_without_rehashing_it(tmp_path) -> None:
    # A slot staged with front_sha256 is re-opened with verify_installed (signature, manifest,
    # "same release as installed"); the full verify is not called at start.
    calls: list[dict] = []

    def verify_installed(path: Path, **kwargs: object) -> FakeVerified:
        calls.append(dict(kwargs))
        if hashlib.sha256(path.read_bytes()).hexdigest() != kwargs["installed_front_sha256"]:
            raise IntegrityError(f"{path}: header and manifest are not the ones installed")
        return FakeVerified(path, str(kwargs["installed_sha256"]), SimpleNamespace())

    def full_verify_not_expected(path: Path, **_: object) -> FakeVerified:
        raise AssertionError("the full verification ran at start")

    store = SlotStore(tmp_path / "data", verify=full_verify_not_expected, verify_installed=verify_installed)
    for release in (1, 2):
        bundle = fake_bundle(tmp_path, "m", release)
        install(store, Fronted(bundle.path, bundle.sha256, bundle.manifest, bundle.sha256))
    verified = store.load_active(trusted_publishers=["pub"], profile=SimpleNamespace(name="rpi5-8gb"))
    assert verified.path == store.bundle_path("b") and not store.load_report["fell_back"]
    assert calls[-1] == {
        "trusted_publishers": ["pub"],
        "profile": "rpi5-8gb",
        "installed_front_sha256": store.slot_info("b")["front_sha256"],
        "installed_sha256": store.slot_info("b")["sha256"],
    }
    store.bundle_path("b").write_bytes(b"ENCRYPTED m 9")  # another release in the slot
    assert store.load_active(["pub"], "rpi5-8gb").path == store.bundle_path("a")
    assert store.load_report["fell_back"] and "not the ones installed" in store.load_report["problems"][0]


@dataclass
class Fronted(FakeVerified):
    front_sha256: str


def test_a_slot_staged_without_front_hash_is_fully_verified_even_when_expired(tmp_path) -> None:
    seen: list[dict] = []

    def verify(path: Path, **kwargs: object) -> FakeVerified:
        seen.append(dict(kwargs))
        return fake_verify(path)

    store = SlotStore(tmp_path / "data", verify=verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    assert store.slot_info("a")["front_sha256"] is None
    store.load_active([], "rpi5-8gb")
    assert seen[-1]["allow_expired"] is True  # expiry stops installs, not serving what is installed


def test_check_file_compares_with_the_hash_recorded_at_install(tmp_path) -> None:
    store = SlotStore(tmp_path / "data", verify=fake_verify)
    install(store, fake_bundle(tmp_path, "m", 1))
    assert store.check_file("a") is None
    store.bundle_path("a").write_bytes(b"ENCRYPTED m 1 rotten")
    assert "slot a: bundle file changed since it was installed" in (store.check_file("a") or "")
    store.bundle_path("a").unlink()
    assert "unreadable" in (store.check_file("a") or "")
    assert store.check_file("b") is None  # nothing recorded: nothing to compare
