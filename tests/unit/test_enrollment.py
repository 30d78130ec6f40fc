"""Enrollment registry: approve, revoke, and what revocation means for bundles."""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.enrollment import enrollment_request

from edgesdk.bundle import decrypt_variant, package_bundle, verify_bundle
from edgesdk.errors import DecryptionError, EnrollmentError
from edgesdk.fleet.enrollment import (
    RegistryFile,
    candidate_from_message,
    decode_public_key,
    encode_public_key,
    enrollment_table,
    recipients_from_registry,
)
from edgesdk.keys import key_id, load_publisher_public_key
from edgesdk.schemas.enrollment import EnrollmentRegistry
from edgesdk.schemas.messages import Presence
from tests.bundle_helpers import make_keys, write_convert_dir
from tests.conftest import assert_one_line_error


def new_device() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def test_approve_revoke_round_trip_on_disk(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    a, b = new_device(), new_device()
    registry.approve("cam-a", a.public_key(), profile="rpi5-8gb")
    registry.approve("cam-b", b.public_key())
    assert [d.device_id for d in registry.approved()] == ["cam-a", "cam-b"]
    revoked = registry.revoke("cam-b", reason="stolen")
    assert revoked.status == "revoked" and revoked.reason == "stolen" and revoked.revoked_at is not None
    document = EnrollmentRegistry.model_validate(json.loads((tmp_path / "reg.json").read_text()))
    assert document.devices["cam-a"].key_id == key_id(a.public_key())
    assert document.devices["cam-a"].profile == "rpi5-8gb"
    assert [d.device_id for d in RegistryFile(tmp_path / "reg.json").approved()] == ["cam-a"]


def test_approving_the_same_key_twice_changes_nothing(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    key = new_device().public_key()
    first = registry.approve("cam-a", key)
    assert registry.approve("cam-a", key) == first


def test_a_new_key_for_an_approved_device_needs_replace(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    old, new = new_device().public_key(), new_device().public_key()
    registry.approve("cam-a", old)
    with pytest.raises(EnrollmentError, match="--replace"):
        registry.approve("cam-a", new)
    entry = registry.approve("cam-a", new, replace=True)
    assert entry.key_id == key_id(new) and key_id(old) in entry.revoked_key_ids
    with pytest.raises(EnrollmentError, match="never approved again"):
        registry.approve("cam-a", old, replace=True)


def test_a_revoked_key_is_never_approved_again_but_a_new_one_is(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    old = new_device().public_key()
    registry.approve("cam-a", old)
    registry.revoke("cam-a")
    with pytest.raises(EnrollmentError, match="revoked"):
        registry.approve("cam-a", old)
    fresh = new_device().public_key()
    assert registry.approve("cam-a", fresh).status == "approved"


def test_expected_key_id_must_match(tmp_path: Path) -> None:
    key = new_device().public_key()
    with pytest.raises(EnrollmentError, match="expected"):
        RegistryFile(tmp_path / "reg.json").approve("cam-a", key, expect_key_id="0" * 32)
    assert RegistryFile(tmp_path / "reg.json").approve("cam-a", key, expect_key_id=key_id(key).upper()).status


def test_revoking_an_unknown_device_lists_known(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    registry.approve("cam-a", new_device().public_key())
    with pytest.raises(EnrollmentError, match="'cam-z'.*known: cam-a"):
        registry.revoke("cam-z")


def test_corrupt_registry_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "reg.json"
    path.write_text('{"schema_version": 1, "devices": {"x": {}}}')
    with pytest.raises(EnrollmentError, match="enrollment registry"):
        RegistryFile(path).load()


def test_recipients_need_an_existing_registry_with_approved_devices(tmp_path: Path) -> None:
    with pytest.raises(EnrollmentError, match="does not exist"):
        recipients_from_registry(tmp_path / "none.json")
    registry = RegistryFile(tmp_path / "reg.json")
    registry.approve("cam-a", new_device().public_key())
    registry.revoke("cam-a")
    with pytest.raises(EnrollmentError, match="no approved device"):
        recipients_from_registry(tmp_path / "reg.json")


@pytest.mark.parametrize("bad", ["not base64!", base64.b64encode(b"short").decode()])
def test_bad_public_keys_are_named(bad: str) -> None:
    with pytest.raises(EnrollmentError) as info:
        decode_public_key(bad)
    assert repr(bad) in str(info.value)


def test_a_bundle_packaged_after_revocation_has_no_slot_for_the_revoked_device(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": os.urandom(4096)}})
    trusted = [load_publisher_public_key(keys.publisher_pub)]
    registry = RegistryFile(tmp_path / "reg.json")
    keep, lose = new_device(), new_device()
    registry.approve("cam-keep", keep.public_key())
    registry.approve("cam-lose", lose.public_key())

    def package(release: int) -> Path:
        return package_bundle(
            convert,
            name="digits",
            version=f"1.{release}.0",
            release=release,
            publisher_key=keys.publisher_key,
            recipients=recipients_from_registry(tmp_path / "reg.json"),
            out=tmp_path / f"r{release}.edgepkg",
        )

    before = verify_bundle(package(1), trusted_publishers=trusted)
    assert (
        decrypt_variant(before, "onnx-fp32", lose)["model.onnx"]
        == decrypt_variant(before, "onnx-fp32", keep)["model.onnx"]
    )

    registry.revoke("cam-lose", reason="decommissioned")
    after = verify_bundle(package(2), trusted_publishers=trusted)
    slots = {slot.recipient for slot in after.manifest.encryption.key_slots}
    assert key_id(keep.public_key()) in slots and key_id(lose.public_key()) not in slots
    assert decrypt_variant(after, "onnx-fp32", keep)["model.onnx"]
    with pytest.raises(DecryptionError):
        decrypt_variant(after, "onnx-fp32", lose)


def test_enroll_request_carries_the_public_key_only() -> None:
    device = new_device()
    request = enrollment_request("cam-a", device.public_key().public_bytes_raw(), profile="rpi5-8gb")
    private_raw = device.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    wire = request.model_dump_json()
    assert base64.b64encode(private_raw).decode() not in wire and private_raw.hex() not in wire
    assert decode_public_key(request.public_key).public_bytes_raw() == device.public_key().public_bytes_raw()
    candidate = candidate_from_message("enroll", wire.encode())
    assert candidate is not None and candidate.key_id == key_id(device.public_key())


def test_candidates_from_presence_and_forged_requests() -> None:
    device = new_device()
    presence = Presence(
        device_id="cam-a",
        online=True,
        ts=datetime.now(timezone.utc),
        profile="rpi5-8gb",
        public_key=encode_public_key(device.public_key()),
    )
    seen = candidate_from_message("presence", presence.model_dump_json().encode())
    assert seen is not None and seen.seen_via == "presence" and seen.key_id == key_id(device.public_key())
    forged = json.loads(enrollment_request("cam-a", device.public_key().public_bytes_raw()).model_dump_json())
    forged["key_id"] = "f" * 32  # key id of another key
    assert candidate_from_message("enroll", json.dumps(forged).encode()) is None
    assert candidate_from_message("enroll", b"\xff not json") is None
    assert candidate_from_message("presence", b'{"kind": "presence"}') is None


def test_table_flags_a_device_offering_a_new_key(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    registry.approve("cam-a", new_device().public_key())
    other = enrollment_request("cam-a", new_device().public_key().public_bytes_raw())
    newcomer = enrollment_request("cam-b", new_device().public_key().public_bytes_raw())
    candidates = {
        c.device_id: c
        for c in (
            candidate_from_message("enroll", other.model_dump_json().encode()),
            candidate_from_message("enroll", newcomer.model_dump_json().encode()),
        )
        if c is not None
    }
    rows = {row["device_id"]: row for row in enrollment_table(registry.load(), candidates)}
    assert rows["cam-a"]["status"] == "key changed"
    assert rows["cam-b"]["status"] == "pending"


def run_enroll(edgesdk_cli, *args: str):
    return edgesdk_cli("fleet", "enroll", *args)


def test_cli_approve_list_revoke(edgesdk_cli, tmp_path: Path) -> None:
    registry = str(tmp_path / "reg.json")
    key = encode_public_key(new_device().public_key())
    proc = run_enroll(edgesdk_cli, "approve", "cam-a", "--registry", registry, "--public-key", key)
    assert proc.returncode == 0, proc.stderr
    assert "approved cam-a" in proc.stdout
    listed = run_enroll(edgesdk_cli, "list", "--registry", registry, "--json")
    assert [r["status"] for r in json.loads(listed.stdout)] == ["approved"]
    assert run_enroll(edgesdk_cli, "revoke", "cam-a", "--registry", registry).returncode == 0
    listed = run_enroll(edgesdk_cli, "list", "--registry", registry, "--json")
    assert [r["status"] for r in json.loads(listed.stdout)] == ["revoked"]
    assert_one_line_error(run_enroll(edgesdk_cli, "revoke", "cam-z", "--registry", registry), "'cam-z'")
    assert_one_line_error(
        run_enroll(edgesdk_cli, "approve", "cam-b", "--registry", registry), "--broker", "--public-key"
    )
    assert_one_line_error(
        run_enroll(edgesdk_cli, "approve", "cam-b", "--registry", registry, "--public-key", "zzz"), "'zzz'"
    )


def test_agent_stand_in_type_is_enough_for_announce() -> None:
    # announce_enrollment reads only config.device_id/profile/mqtt.namespace and device_public_key().
    from edgesdk.agent.enrollment import announce_enrollment

    published: list[tuple[str, bytes, int, bool]] = []

    class Client:
        def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> int:
            published.append((topic, payload, qos, retain))
            return 1

    agent = SimpleNamespace(
        config=SimpleNamespace(device_id="cam-a", profile="rpi5-8gb", mqtt=SimpleNamespace(namespace="fleet1")),
        device_public_key=new_device().public_key().public_bytes_raw,
    )
    request = announce_enrollment(agent, SimpleNamespace(client=Client()))
    assert request is not None
    ((topic, payload, qos, retain),) = published
    assert topic == "fleet1/devices/cam-a/enroll" and qos == 1 and retain
    assert json.loads(payload)["key_id"] == request.key_id


def test_package_cli_takes_recipients_from_the_registry(edgesdk_cli, tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": os.urandom(2048)}})
    registry = RegistryFile(tmp_path / "reg.json")
    keep, lose = new_device(), new_device()
    registry.approve("cam-keep", keep.public_key())
    registry.approve("cam-lose", lose.public_key())
    registry.revoke("cam-lose")

    def package(*extra: str):
        return edgesdk_cli(
            "package", str(convert), "--name", "digits", "--version", "1.0.0", "--release", "3",
            "--publisher-key", str(keys.publisher_key), "--out", str(tmp_path / "b.edgepkg"), "--json", *extra,
        )  # fmt: skip

    proc = package("--recipients-from-registry", str(tmp_path / "reg.json"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recipients"] == [key_id(keep.public_key())]
    assert_one_line_error(package("--recipients-from-registry", str(tmp_path / "nope.json")), "nope.json")
