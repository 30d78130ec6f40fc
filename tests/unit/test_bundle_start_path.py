"""The agent's start-up path for an installed bundle: ``verify_installed_bundle`` re-checks
signature, manifest and target without re-hashing payloads, and ``decrypt_and_load`` proves
the plaintext while the runtime session is built. Nothing the device runs may escape either
check: every flipped byte is still refused by one of them."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from edgesdk.bundle import (
    decrypt_and_load,
    decrypt_golden,
    decrypt_variant,
    package_bundle,
    verify_installed_bundle,
)
from edgesdk.bundle.decrypt import CONCURRENT_HASH_MIN_BYTES, PARALLEL_DECRYPT_MIN_BYTES
from edgesdk.errors import BundleError, IntegrityError, SignatureError, TargetMismatchError
from tests.bundle_helpers import resign_bundle, write_convert_dir
from tests.unit.test_bundle_verify import NOW, REGIONS, _signer, copy_bundle, env, position_of, verify

# ``env`` is test_bundle_verify's module fixture (the same bundle the full verification tests
# use); exporting it marks the import as used.
__all__ = ["env"]


def reopen(path: Path, env: dict[str, Any], installed: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("trusted_publishers", [env["keys"].publisher_pub])
    return verify_installed_bundle(
        path, installed_front_sha256=installed.front_sha256, installed_sha256=installed.sha256, **kwargs
    )


class Loaded:
    """What a loader returns; remembers whether it was closed."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_reopened_bundle_loads_the_same_files(env) -> None:
    installed = verify(env["bundle"], env)
    reopened = reopen(env["bundle"], env, installed, profile="rpi5-8gb")
    assert (reopened.payloads_hashed, installed.payloads_hashed) == (False, True)
    assert reopened.sha256 == installed.sha256 and reopened.front_sha256 == installed.front_sha256
    device = env["keys"].device()
    for variant_id, files in env["files"].items():
        loaded = decrypt_and_load(reopened, variant_id, device, Loaded)
        assert loaded.files == files == decrypt_variant(reopened, variant_id, device)
        assert not loaded.closed


def test_expired_bundle_still_reopens(env) -> None:
    # Expiry stops installing a stale bundle, not serving the installed one after a reboot.
    installed = verify(env["bundle"], env)
    assert reopen(env["bundle"], env, installed).manifest.expires < NOW + timedelta(days=365)


def test_another_validly_signed_release_in_the_slot_is_refused(env, tmp_path) -> None:
    installed = verify(env["bundle"], env)

    def older(m: dict) -> None:
        m["model"]["release"] = 1

    swapped = resign_bundle(env["bundle"], tmp_path / "older.edgepkg", _signer(env), older)
    with pytest.raises(IntegrityError, match="header and manifest are not the ones installed"):
        reopen(swapped, env, installed)


def test_signature_and_target_are_checked_again(env, tmp_path) -> None:
    installed = verify(env["bundle"], env)
    with pytest.raises(TargetMismatchError):
        reopen(env["bundle"], env, installed, profile="jetson-orin-nano-8gb")
    path = copy_bundle(env, tmp_path)
    data = bytearray(path.read_bytes())
    data[100] ^= 1  # inside the manifest
    path.write_bytes(bytes(data))
    with pytest.raises(SignatureError):
        reopen(path, env, installed)


@pytest.mark.parametrize("region", REGIONS)
def test_one_flipped_byte_anywhere_is_still_refused_before_use(env, tmp_path, region: str) -> None:
    installed = verify(env["bundle"], env)
    path = copy_bundle(env, tmp_path)
    data = bytearray(path.read_bytes())
    data[position_of(region, path)] ^= 0x01
    path.write_bytes(bytes(data))
    try:
        reopened = reopen(path, env, installed)
    except BundleError:
        return  # refused at re-open: header, manifest or signature
    # Only the payloads were not re-read: the damaged one must fail when it is decrypted, and
    # its loader's result must never come back.
    device = env["keys"].device()
    refused = []
    for variant_id in env["files"]:
        try:
            decrypt_and_load(reopened, variant_id, device, Loaded)
        except IntegrityError:
            refused.append(variant_id)
    try:
        decrypt_golden(reopened, device)
    except IntegrityError:
        refused.append("golden")
    assert len(refused) == 1, (region, refused)


def _bundle_with_wrong_plaintext_hash(env, tmp_path: Path, size: int) -> tuple[Any, bytes]:
    """GCM-valid ciphertext whose manifest (signed by the trusted publisher) pins another
    plaintext: what a co-recipient who knows the content key could produce."""
    content = os.urandom(size)
    convert = write_convert_dir(tmp_path / f"c{size}", {"onnx-fp32": {"model.onnx": content}})
    good = package_bundle(convert, name="d", version="1.0.0", release=1, publisher_key=env["keys"].publisher_key,
                          recipients=[env["keys"].device_pub], out=tmp_path / f"good{size}.edgepkg")  # fmt: skip

    def mutate(m: dict) -> None:
        m["variants"][0]["sha256"] = "0" * 64

    bad = resign_bundle(good, tmp_path / f"bad{size}.edgepkg", _signer(env), mutate)
    installed = verify(bad, env)
    return reopen(bad, env, installed), content


@pytest.mark.parametrize("size", [1000, CONCURRENT_HASH_MIN_BYTES + 4321], ids=["inline-hash", "concurrent-hash"])
def test_a_model_whose_plaintext_hash_fails_is_closed_and_never_returned(env, tmp_path, size: int) -> None:
    reopened, content = _bundle_with_wrong_plaintext_hash(env, tmp_path, size)
    made: list[Loaded] = []

    def load(files: dict[str, bytes]) -> Loaded:
        assert files == {"model.onnx": content}  # GCM-authenticated bytes reach the loader ...
        made.append(Loaded(files))
        return made[-1]

    with pytest.raises(IntegrityError, match="plaintext does not match its signed SHA-256"):
        decrypt_and_load(reopened, "onnx-fp32", env["keys"].device(), load)
    assert len(made) == 1 and made[0].closed  # ... but what was built from them is dropped


def test_a_loader_failure_on_bad_plaintext_reports_the_integrity_error(env, tmp_path) -> None:
    reopened, _ = _bundle_with_wrong_plaintext_hash(env, tmp_path, CONCURRENT_HASH_MIN_BYTES * 2)

    def load(files: dict[str, bytes]) -> Loaded:
        raise ValueError("cannot parse this model")

    with pytest.raises(IntegrityError) as info:
        decrypt_and_load(reopened, "onnx-fp32", env["keys"].device(), load)
    assert isinstance(info.value.__cause__, ValueError)


def test_a_loader_failure_on_good_plaintext_is_the_loaders_own(env) -> None:
    installed = verify(env["bundle"], env)

    def load(files: dict[str, bytes]) -> Loaded:
        raise ValueError("runtime says no")

    with pytest.raises(ValueError, match="runtime says no"):
        decrypt_and_load(installed, "onnx-fp32", env["keys"].device(), load)


@pytest.mark.parametrize("where", ["first-half", "second-half"])
def test_large_multi_file_variant_decrypted_on_two_threads(env, tmp_path, where: str) -> None:
    # Big enough for the two-thread decryption and the concurrent hash; model.xml and
    # model.bin meet inside segment 0 (the spanning path, on the worker thread).
    ir = {"model.xml": os.urandom(70_001), "model.bin": os.urandom(PARALLEL_DECRYPT_MIN_BYTES + 5)}
    convert = write_convert_dir(tmp_path / "c", {"openvino-fp32": ir})
    out = package_bundle(convert, name="d", version="1.0.0", release=1, publisher_key=env["keys"].publisher_key,
                         recipients=[env["keys"].device_pub], out=tmp_path / "ir.edgepkg")  # fmt: skip
    reopened = reopen(out, env, verify(out, env))
    assert decrypt_and_load(reopened, "openvino-fp32", env["keys"].device(), Loaded).files == ir
    offset, length = _payload_span(reopened, "openvino-fp32")
    data = bytearray(out.read_bytes())
    data[offset + (length // 8 if where == "first-half" else length - 1000)] ^= 1
    out.write_bytes(bytes(data))
    made: list[Loaded] = []
    with pytest.raises(IntegrityError, match="segment .* failed authentication"):
        decrypt_and_load(reopened, "openvino-fp32", env["keys"].device(), lambda f: made.append(Loaded(f)))
    assert made == []  # a GCM failure stops before anything is loaded


def _payload_span(bundle: Any, variant_id: str) -> tuple[int, int]:
    name = bundle.manifest.variant(variant_id).payload
    location = next(p for p in bundle.manifest.encryption.payloads if p.name == name)
    return bundle.payload_area_offset + location.offset, location.length
