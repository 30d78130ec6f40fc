"""package → verify → decrypt, and every bad input of issue 4 refused by verify_bundle()
(or, for a wrong device key, by decryption) with one clear error and no VerifiedBundle."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.bundle import (
    VerifiedBundle,
    decrypt_golden,
    decrypt_variant,
    inspect_bundle,
    package_bundle,
    verify_bundle,
)
from edgesdk.bundle.container import HEADER_SIZE, SIGNATURE_SIZE, ciphertext_length
from edgesdk.errors import (
    BundleError,
    BundleFormatError,
    DecryptionError,
    ExpiredBundleError,
    IntegrityError,
    RollbackError,
    SignatureError,
    TargetMismatchError,
    UsageError,
)
from edgesdk.profiles import get_profile
from tests.bundle_helpers import craft_bundle, make_keys, resign_bundle, split_bundle, write_convert_dir

SEGMENT = 64 * 1024
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
RELEASE = 7


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    keys = make_keys(root / "keys")
    files = {
        "onnx-fp32": {"model.onnx": os.urandom(300_000)},
        "openvino-int8": {"model.xml": b"<net/>" * 100, "model.bin": os.urandom(150_000)},
    }
    convert = write_convert_dir(
        root / "convert", files, golden={"image": np.arange(128, dtype=np.float32).reshape(2, 1, 8, 8)}
    )
    bundle = package_bundle(
        convert,
        name="digits",
        version="1.2.0",
        release=RELEASE,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        expires=timedelta(days=30),
        out=root / "digits.edgepkg",
        segment_size=SEGMENT,
        now=NOW,
    )
    return {"root": root, "keys": keys, "files": files, "convert": convert, "bundle": bundle}


def verify(path: Path, env, **kwargs) -> VerifiedBundle:
    kwargs.setdefault("trusted_publishers", [env["keys"].publisher_pub])
    kwargs.setdefault("now", NOW + timedelta(days=1))
    return verify_bundle(path, **kwargs)


def copy_bundle(env, tmp_path: Path) -> Path:
    return Path(shutil.copyfile(env["bundle"], tmp_path / "copy.edgepkg"))


def assert_refused(exc_info, path: Path) -> None:
    message = str(exc_info.value)
    assert "\n" not in message and str(path) in message, message


# --- the good path -------------------------------------------------------------------


def test_round_trip_every_variant_and_golden(env) -> None:
    verified = verify(env["bundle"], env, profile="rpi5-8gb", installed_release=RELEASE - 1)
    assert verified.manifest.model.release == RELEASE
    assert verified.size == env["bundle"].stat().st_size
    for variant_id, files in env["files"].items():
        assert decrypt_variant(verified, variant_id, env["keys"].device()) == files
    golden = decrypt_golden(verified, env["keys"].device())
    assert golden is not None and golden["image"].shape == (2, 1, 8, 8)


def test_manifest_describes_files_and_encryption(env) -> None:
    manifest = verify(env["bundle"], env).manifest
    ov = manifest.variant("openvino-int8")
    assert [f.name for f in ov.files] == ["model.bin", "model.xml"] or [f.name for f in ov.files] == [
        "model.xml",
        "model.bin",
    ]
    assert ov.size == 150_000 + 600
    assert ov.encrypted_size == ciphertext_length(ov.size, SEGMENT)
    assert manifest.encryption is not None and manifest.encryption.segment_size == SEGMENT
    assert manifest.targets == ["rpi5-8gb"]
    assert manifest.expires == NOW + timedelta(days=30)


def test_several_recipients_and_a_group_key(env, tmp_path) -> None:
    other = make_keys(tmp_path / "other")
    group = make_keys(tmp_path / "group")
    out = package_bundle(
        env["convert"],
        name="digits",
        version="1.2.0",
        release=1,
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub, other.device_pub],
        group_recipients=[group.device_pub],
        out=tmp_path / "multi.edgepkg",
    )
    verified = verify(out, env)
    for keys in (env["keys"], other, group):
        assert decrypt_variant(verified, "onnx-fp32", keys.device()) == env["files"]["onnx-fp32"]
    assert [s.kind for s in verified.manifest.encryption.key_slots] == ["device", "device", "group"]


def test_same_input_gives_different_ciphertext(env, tmp_path) -> None:
    a = package_bundle(
        env["convert"],
        name="d",
        version="1.0.0",
        release=1,
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub],
        out=tmp_path / "a.edgepkg",
    )
    b = package_bundle(
        env["convert"],
        name="d",
        version="1.0.0",
        release=1,
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub],
        out=tmp_path / "b.edgepkg",
    )
    assert split_bundle(a)[1] != split_bundle(b)[1]


def test_default_release_is_a_timestamp(env, tmp_path) -> None:
    out = package_bundle(
        env["convert"],
        name="d",
        version="1.0.0",
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub],
        out=tmp_path / "t.edgepkg",
        now=NOW,
    )
    assert inspect_bundle(out).manifest.model.release == int(NOW.timestamp())


def test_the_plaintext_is_not_in_the_bundle(env) -> None:
    data = env["bundle"].read_bytes()
    for files in env["files"].values():
        for content in files.values():
            assert len(content) >= 64 and content[-64:] not in data


# --- verification is a type ------------------------------------------------------------


def test_verified_bundle_cannot_be_made_or_changed_elsewhere(env) -> None:
    verified = verify(env["bundle"], env)
    with pytest.raises(TypeError, match="only by edgesdk.bundle.verify_bundle"):
        VerifiedBundle(_token=object(), manifest=verified.manifest, path=env["bundle"])
    with pytest.raises(AttributeError, match="read-only"):
        verified.manifest = verified.manifest  # type: ignore[misc]
    with pytest.raises(TypeError):
        pickle.dumps(verified)
    with pytest.raises(TypeError):
        copy.copy(verified)


def test_decryption_takes_nothing_but_a_verified_bundle(env) -> None:
    unverified = inspect_bundle(env["bundle"])
    with pytest.raises(TypeError, match="VerifiedBundle"):
        decrypt_variant(unverified, "onnx-fp32", env["keys"].device())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="VerifiedBundle"):
        decrypt_variant(env["bundle"], "onnx-fp32", env["keys"].device())  # type: ignore[arg-type]


def test_unknown_variant_lists_known(env) -> None:
    with pytest.raises(UsageError, match="no variant 'tflite-fp32'; it has: onnx-fp32, openvino-int8"):
        decrypt_variant(verify(env["bundle"], env), "tflite-fp32", env["keys"].device())


# --- bad input: one clear error each ------------------------------------------------------


def test_tampered_manifest(env, tmp_path) -> None:
    path = copy_bundle(env, tmp_path)
    data = path.read_bytes()
    tampered = data.replace(f'"release":{RELEASE}'.encode(), f'"release":{RELEASE + 1}'.encode(), 1)
    assert tampered != data
    path.write_bytes(tampered)
    with pytest.raises(SignatureError, match="signature does not verify") as info:
        verify(path, env)
    assert_refused(info, path)


REGIONS = [
    "magic", "version", "flags", "manifest-length", "key-id", "payload-length", "reserved",
    "manifest-first", "manifest-middle", "manifest-last", "signature-first", "signature-last",
    "payload-first", "segment-0-tag-last", "segment-1-first", "golden-tag", "last-byte",
] + [f"spread-{i}-of-40" for i in range(40)]  # fmt: skip


def position_of(region: str, path: Path) -> int:
    size = path.stat().st_size
    m = inspect_bundle(path).header.manifest_length
    payload = HEADER_SIZE + m + SIGNATURE_SIZE
    named = {
        "magic": 0, "version": 9, "flags": 11, "manifest-length": 13, "key-id": 20, "payload-length": 39,
        "reserved": 45, "manifest-first": HEADER_SIZE, "manifest-middle": HEADER_SIZE + m // 2,
        "manifest-last": HEADER_SIZE + m - 1, "signature-first": HEADER_SIZE + m,
        "signature-last": payload - 1, "payload-first": payload, "segment-0-tag-last": payload + SEGMENT + 15,
        "segment-1-first": payload + SEGMENT + 16, "golden-tag": size - 10, "last-byte": size - 1,
    }  # fmt: skip
    if region in named:
        return named[region]
    return size * int(region.split("-")[1]) // 40


@pytest.mark.parametrize("region", REGIONS)
def test_one_flipped_byte_anywhere_is_refused(env, tmp_path, region: str) -> None:
    path = copy_bundle(env, tmp_path)
    data = bytearray(path.read_bytes())
    data[position_of(region, path)] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError) as info:
        verify(path, env, profile="rpi5-8gb", installed_release=1)
    assert_refused(info, path)


def test_flipped_payload_byte_names_the_payload(env, tmp_path) -> None:
    path = copy_bundle(env, tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x80  # inside the last payload (the golden set)
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="payload 'golden.npz.enc' does not match its signed SHA-256"):
        verify(path, env)


@pytest.mark.parametrize("keep", [0, 5, HEADER_SIZE - 1, HEADER_SIZE, 500, -SEGMENT, -1])
def test_truncated_file(env, tmp_path, keep: int) -> None:
    path = copy_bundle(env, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(BundleFormatError, match="truncated|not an edgesdk bundle") as info:
        verify(path, env)
    assert_refused(info, path)


def test_appended_data(env, tmp_path) -> None:
    path = copy_bundle(env, tmp_path)
    path.write_bytes(path.read_bytes() + b"\0" * 10)
    with pytest.raises(BundleFormatError, match="10 unexpected bytes after the declared end"):
        verify(path, env)


def test_wrong_device_key(env) -> None:
    verified = verify(env["bundle"], env)  # anyone may verify; only recipients decrypt
    with pytest.raises(DecryptionError, match="not encrypted for device key"):
        decrypt_variant(verified, "onnx-fp32", X25519PrivateKey.generate())
    with pytest.raises(DecryptionError, match="not encrypted for device key"):
        decrypt_golden(verified, X25519PrivateKey.generate())


def test_unknown_publisher(env, tmp_path) -> None:
    stranger = make_keys(tmp_path / "stranger")
    with pytest.raises(SignatureError, match="signed by unknown publisher key .*; trusted: ") as info:
        verify(env["bundle"], env, trusted_publishers=[stranger.publisher_pub])
    assert_refused(info, env["bundle"])


def test_attacker_claiming_a_trusted_key_id(env, tmp_path) -> None:
    from edgesdk.keys import key_id_bytes

    attacker = Ed25519PrivateKey.generate()
    manifest, payloads = split_bundle(env["bundle"])
    import json

    path = craft_bundle(
        tmp_path / "forged.edgepkg",
        json.dumps(manifest).encode(),
        payloads,
        attacker,
        publisher_key_id=key_id_bytes(env["keys"].trusted()),
    )
    with pytest.raises(SignatureError, match="signature does not verify"):
        verify(path, env)


def test_expired(env) -> None:
    with pytest.raises(ExpiredBundleError, match="bundle expired at 2026-12-30") as info:
        verify(env["bundle"], env, now=NOW + timedelta(days=31))
    assert_refused(info, env["bundle"])
    # Re-verifying an installed bundle: expiry alone is waived, everything else still holds.
    later = NOW + timedelta(days=31)
    assert verify(env["bundle"], env, now=later, allow_expired=True).manifest.model.release == RELEASE
    with pytest.raises(RollbackError):
        verify(env["bundle"], env, now=later, allow_expired=True, installed_release=RELEASE)


def test_older_release_is_a_rollback(env) -> None:
    for installed in (RELEASE, RELEASE + 5):
        with pytest.raises(
            RollbackError, match=f"release {RELEASE} is not newer than the installed release {installed}"
        ):
            verify(env["bundle"], env, installed_release=installed)


def downgrade_bundle(env, tmp_path: Path, *, from_releases: tuple[int, int], expires_at: datetime) -> Path:
    from edgesdk.schemas.manifest import DowngradePermission

    permission = DowngradePermission(from_releases=from_releases, expires_at=expires_at)
    return package_bundle(
        env["convert"],
        name="digits",
        version="1.1.0",
        release=2,
        downgrade=permission,
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub],
        out=tmp_path / "down.edgepkg",
        now=NOW,
    )


def test_signed_downgrade_installs_over_a_floor_in_its_range(env, tmp_path) -> None:
    out = downgrade_bundle(env, tmp_path, from_releases=(RELEASE - 1, RELEASE + 1), expires_at=NOW + timedelta(days=7))
    verified = verify(out, env, installed_release=RELEASE, rollback_floor=RELEASE)
    assert verified.manifest.downgrade.from_releases == (RELEASE - 1, RELEASE + 1)
    # The floor, not store.json's installed release, is what the range is checked against.
    assert verify(out, env, installed_release=None, rollback_floor=RELEASE + 1).manifest.model.release == 2


def test_signed_downgrade_outside_its_range_is_refused(env, tmp_path) -> None:
    out = downgrade_bundle(env, tmp_path, from_releases=(RELEASE - 1, RELEASE + 1), expires_at=NOW + timedelta(days=7))
    with pytest.raises(RollbackError, match=f"covers floors {RELEASE - 1}-{RELEASE + 1}, not this device's 9") as info:
        verify(out, env, rollback_floor=RELEASE + 2)
    assert_refused(info, out)


def test_signed_downgrade_after_it_expired_is_refused(env, tmp_path) -> None:
    out = downgrade_bundle(env, tmp_path, from_releases=(RELEASE, RELEASE), expires_at=NOW + timedelta(hours=1))
    with pytest.raises(RollbackError, match="downgrade permission expired at 2026-11-30T13:00:00"):
        verify(out, env, rollback_floor=RELEASE, now=NOW + timedelta(hours=2))
    assert verify(out, env, rollback_floor=RELEASE, now=NOW + timedelta(minutes=59)).manifest.model.release == 2


def test_a_release_below_the_floor_is_refused_even_without_an_installed_release(env) -> None:
    # store.json lost: installed_release is None, the floor still holds.
    with pytest.raises(RollbackError, match=f"release {RELEASE} is below this device's rollback floor 8"):
        verify(env["bundle"], env, installed_release=None, rollback_floor=RELEASE + 1)
    # The release the floor names may be installed again (after a fallback, for instance).
    assert verify(env["bundle"], env, installed_release=None, rollback_floor=RELEASE).manifest.model.release == RELEASE


def test_legacy_unbounded_allow_downgrade_still_loads_but_is_not_honoured(env, tmp_path) -> None:
    def legacy(manifest: dict) -> None:
        manifest["allow_downgrade"] = True

    out = resign_bundle(env["bundle"], tmp_path / "legacy.edgepkg", env["keys"].signer(), legacy)
    assert verify(out, env).manifest.allow_downgrade is True  # an old manifest still loads
    with pytest.raises(RollbackError, match="unbounded allow_downgrade is no longer honoured"):
        verify(out, env, rollback_floor=RELEASE + 1)


def test_a_downgrade_permission_must_point_down_and_be_bounded() -> None:
    from edgesdk.errors import SchemaError
    from edgesdk.schemas.manifest import DowngradePermission

    with pytest.raises(SchemaError, match="1 <= min <= max"):
        DowngradePermission.parse_obj_clear({"from_releases": [5, 3], "expires_at": NOW.isoformat()}, source="t")
    with pytest.raises(SchemaError, match="timezone"):
        DowngradePermission.parse_obj_clear({"from_releases": [3, 5], "expires_at": "2026-01-01T00:00:00"}, source="t")


def test_other_profile(env) -> None:
    with pytest.raises(TargetMismatchError, match="targets rpi5-8gb, not this device's profile 'jetson-nano'"):
        verify(env["bundle"], env, profile="jetson-nano")
    assert verify(env["bundle"], env, profile=get_profile("rpi5-8gb")).manifest.targets == ["rpi5-8gb"]


def _signer(env):
    return env["keys"].signer()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda m: m["variants"][0]["files"][0].update(name="../../etc/passwd"), "files.0.name"),
        (lambda m: m["variants"][0]["files"][0].update(name="/etc/passwd"), "files.0.name"),
        (lambda m: m["variants"][0].update(payload="../escape"), "variants.0.payload"),
        (lambda m: m["encryption"]["payloads"][0].update(name="../escape"), "payloads.0.name"),
        (lambda m: m["encryption"]["payloads"][0].update(offset=2**62), "gap or overlap"),
        (lambda m: m["encryption"].update(segment_size=2**40), "segment_size"),
    ],
    ids=[
        "file-traversal",
        "file-absolute",
        "payload-traversal",
        "location-traversal",
        "absurd-offset",
        "absurd-segment",
    ],
)
def test_signed_but_malicious_layouts(env, tmp_path, mutate, needle: str) -> None:
    # Signed by the trusted key: what a compromised or buggy packager could produce.
    path = resign_bundle(env["bundle"], tmp_path / "evil.edgepkg", _signer(env), mutate)
    with pytest.raises(BundleFormatError, match=needle) as info:
        verify(path, env)
    assert_refused(info, path)


def test_absurd_declared_size(env, tmp_path) -> None:
    def mutate(m: dict) -> None:
        v = m["variants"][0]
        v["size"] = 2**50
        v["files"] = [dict(v["files"][0], size=2**50)]

    path = resign_bundle(env["bundle"], tmp_path / "huge.edgepkg", _signer(env), mutate)
    with pytest.raises(BundleFormatError, match="declares 1125899906842624 bytes"):
        verify(path, env)


def test_payload_larger_than_declared(env, tmp_path) -> None:
    # The manifest says 10 bytes; the container holds 300 kB for it (a "zip bomb" in spirit).
    def mutate(m: dict) -> None:
        v = m["variants"][0]
        v["size"] = 10
        v["files"] = [dict(v["files"][0], size=10)]

    path = resign_bundle(env["bundle"], tmp_path / "bomb.edgepkg", _signer(env), mutate)
    with pytest.raises(BundleFormatError, match="but 10 plaintext bytes encrypt to 26"):
        verify(path, env)


def test_payload_area_bigger_than_the_payloads(env, tmp_path) -> None:
    _, payloads = split_bundle(env["bundle"])
    path = resign_bundle(
        env["bundle"],
        tmp_path / "extra.edgepkg",
        _signer(env),
        lambda m: None,
        payload_area=payloads + os.urandom(1 << 20),
    )
    with pytest.raises(BundleFormatError, match="payloads cover .* but the payload area is"):
        verify(path, env)


def test_absurd_header_lengths(env, tmp_path) -> None:
    manifest, payloads = split_bundle(env["bundle"])
    import json

    body = json.dumps(manifest).encode()
    for field, value, needle in [
        ("manifest_length", 2**31, "manifest length 2147483648 is outside"),
        ("payload_area_length", 2**62, "payload area of 4611686018427387904 bytes exceeds"),
        ("payload_area_length", len(payloads) + 1, "truncated"),
    ]:
        path = craft_bundle(tmp_path / f"{field}.edgepkg", body, payloads, _signer(env), **{field: value})
        with pytest.raises(BundleFormatError, match=needle):
            verify(path, env)


def test_mix_and_match_payloads_from_another_bundle(env, tmp_path) -> None:
    # Same layout, other release: its payloads under this manifest do not match the hashes.
    other = package_bundle(
        env["convert"],
        name="digits",
        version="1.2.0",
        release=RELEASE,
        publisher_key=env["keys"].publisher_key,
        recipients=[env["keys"].device_pub],
        out=tmp_path / "other.edgepkg",
        segment_size=SEGMENT,
    )
    data = env["bundle"].read_bytes()
    front = len(data) - len(split_bundle(env["bundle"])[1])
    mixed = tmp_path / "mixed.edgepkg"
    mixed.write_bytes(data[:front] + split_bundle(other)[1])
    with pytest.raises(IntegrityError, match="does not match its signed SHA-256"):
        verify(mixed, env)


def test_bundle_changed_after_verification_fails_decryption(env, tmp_path) -> None:
    path = copy_bundle(env, tmp_path)
    verified = verify(path, env)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="failed authentication"):
        decrypt_golden(verified, env["keys"].device())


def test_not_a_bundle(env, tmp_path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07" + os.urandom(200))
    with pytest.raises(BundleFormatError, match="not an edgesdk bundle"):
        verify(path, env)
    with pytest.raises(BundleFormatError, match="cannot read bundle"):
        verify(tmp_path / "missing.edgepkg", env)


# --- the packager's own bad input --------------------------------------------------------


def test_packager_refuses_traversal_in_the_report(env, tmp_path) -> None:
    convert = write_convert_dir(tmp_path / "c", {"onnx-fp32": {"model.onnx": b"x"}})
    (tmp_path / "secret.txt").write_text("secret")
    report = (convert / "report.json").read_text().replace("artifacts/onnx-fp32/model.onnx", "../secret.txt")
    (convert / "report.json").write_text(report)
    with pytest.raises(UsageError, match="'../secret.txt' leaves the convert dir"):
        package_bundle(
            convert,
            name="d",
            version="1.0.0",
            release=1,
            publisher_key=env["keys"].publisher_key,
            recipients=[env["keys"].device_pub],
            out=tmp_path / "x.edgepkg",
        )
    assert not (tmp_path / "x.edgepkg").exists()


def test_packager_refuses_symlinks(env, tmp_path) -> None:
    convert = write_convert_dir(tmp_path / "c", {"onnx-fp32": {"model.onnx": b"x"}})
    target = convert / "artifacts" / "onnx-fp32" / "model.onnx"
    target.unlink()
    (convert / "inside.bin").write_bytes(b"y")
    target.symlink_to(convert / "inside.bin")
    with pytest.raises(UsageError, match="not a regular file"):
        package_bundle(
            convert,
            name="d",
            version="1.0.0",
            release=1,
            publisher_key=env["keys"].publisher_key,
            recipients=[env["keys"].device_pub],
            out=tmp_path / "x.edgepkg",
        )
    target.unlink()
    target.symlink_to(env["convert"] / "artifacts" / "onnx-fp32" / "model.onnx")
    with pytest.raises(UsageError, match="resolves outside the convert dir"):
        package_bundle(
            convert,
            name="d",
            version="1.0.0",
            release=1,
            publisher_key=env["keys"].publisher_key,
            recipients=[env["keys"].device_pub],
            out=tmp_path / "x.edgepkg",
        )


def test_packager_needs_recipients_and_a_report(env, tmp_path) -> None:
    with pytest.raises(UsageError, match="no recipients"):
        package_bundle(
            env["convert"],
            name="d",
            version="1.0.0",
            release=1,
            publisher_key=env["keys"].publisher_key,
            recipients=[],
            out=tmp_path / "x.edgepkg",
        )
    with pytest.raises(UsageError, match="no report.json"):
        package_bundle(
            tmp_path,
            name="d",
            version="1.0.0",
            release=1,
            publisher_key=env["keys"].publisher_key,
            recipients=[env["keys"].device_pub],
            out=tmp_path / "x.edgepkg",
        )
    assert list(tmp_path.glob("*.edgepkg")) == [] and list(tmp_path.glob(".*tmp")) == []


def test_plaintext_hash_is_checked_after_decryption(env, tmp_path) -> None:
    # AES-GCM is not key-committing: a malicious publisher could hand different devices
    # different keys for one ciphertext. The signed plaintext SHA-256 pins the plaintext.
    def mutate(m: dict) -> None:
        m["variants"][0]["sha256"] = "0" * 64

    path = resign_bundle(env["bundle"], tmp_path / "plain.edgepkg", _signer(env), mutate)
    verified = verify(path, env)
    with pytest.raises(IntegrityError, match="payload 'onnx-fp32.enc' plaintext does not match its signed SHA-256"):
        decrypt_variant(verified, "onnx-fp32", env["keys"].device())


def test_large_payload_hashes_on_a_second_thread(env, tmp_path) -> None:
    # Above the threshold verify and decrypt overlap two hash passes; results must not change.
    from edgesdk.bundle.background_hash import THREAD_MIN_BYTES

    content = os.urandom(THREAD_MIN_BYTES + 12345)
    # A second, multi-file variant whose files meet inside a segment (the spanning path).
    ir = {"model.xml": os.urandom(1_500_001), "model.bin": os.urandom(THREAD_MIN_BYTES + 7)}
    convert = write_convert_dir(tmp_path / "c", {"onnx-fp32": {"model.onnx": content}, "openvino-fp32": ir})
    out = package_bundle(convert, name="d", version="1.0.0", release=1, publisher_key=env["keys"].publisher_key,
                         recipients=[env["keys"].device_pub], out=tmp_path / "big.edgepkg")  # fmt: skip
    verified = verify(out, env)
    import hashlib

    assert verified.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    assert decrypt_variant(verified, "onnx-fp32", env["keys"].device()) == {"model.onnx": content}
    assert decrypt_variant(verified, "openvino-fp32", env["keys"].device()) == ir
    data = bytearray(out.read_bytes())
    data[-THREAD_MIN_BYTES] ^= 1
    out.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="openvino-fp32.enc.*does not match its signed SHA-256"):
        verify(out, env)
