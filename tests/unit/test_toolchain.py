"""The public Python API (edgesdk.package, verify_bundle, load_profile) on a small convert dir,
and ``import edgesdk`` staying lazy. edgesdk.convert runs for real in
tests/integration/test_examples.py (examples/embedded_developer/convert_and_package.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.errors import ProfileError, RollbackError, SignatureError, TargetMismatchError, UsageError
from edgesdk.schemas.report import ConversionReport
from tests.bundle_helpers import make_keys, write_convert_dir


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    keys = make_keys(root / "keys")
    convert = write_convert_dir(
        root / "convert",
        {"onnx-fp32": {"model.onnx": os.urandom(5000)}, "onnx-int8": {"model.onnx": os.urandom(2000)}},
        golden={"image": np.zeros((2, 1, 8, 8), np.float32)},
    )
    return root, keys, convert


def test_package_then_verify_with_key_files(setup) -> None:
    root, keys, convert = setup
    bundle = edgesdk.package(
        convert,
        version="1.2.0",
        release=7,
        publisher_key=keys.publisher_key,
        recipients=keys.device_pub,  # one path, not a list: still one recipient
        expires="30d",
        targets=["rpi5-8gb"],
        out=root / "digits.edgepkg",
    )
    assert bundle == root / "digits.edgepkg" and bundle.is_file()
    result = edgesdk.verify_bundle(
        bundle,
        trusted_publishers=keys.publisher_pub,
        device_key=keys.device_key,
        profile="rpi5-8gb",
        installed_release=6,
    )
    assert result.manifest.model.name == "digits"  # defaulted from the report
    assert result.manifest.model.release == 7 and result.manifest.model.version == "1.2.0"
    assert result.checks == (
        "signature",
        "payload hashes",
        "expiry",
        "target profile",
        "anti-rollback",
        "decryption + plaintext hashes",
    )
    assert {k: (v.files, v.size) for k, v in result.decrypted.items()} == {
        "onnx-fp32": (1, 5000),
        "onnx-int8": (1, 2000),
    }
    assert result.golden_arrays == 1
    assert result.path == bundle.resolve() and len(result.sha256) == 64
    expires = result.manifest.expires
    assert expires is not None and expires - datetime.now(timezone.utc) > timedelta(days=29)

    # Without a device key nothing is decrypted; the checks say so.
    plain = edgesdk.verify_bundle(str(bundle), trusted_publishers=[str(keys.publisher_pub)])
    assert plain.checks == ("signature", "payload hashes", "expiry") and plain.decrypted == {}
    with pytest.raises(RollbackError, match="release 7 is not newer than the installed release 7"):
        edgesdk.verify_bundle(bundle, trusted_publishers=keys.publisher_pub, installed_release=7)
    with pytest.raises(TargetMismatchError, match="jetson-orin-nano-8gb"):
        edgesdk.verify_bundle(bundle, trusted_publishers=keys.publisher_pub, profile="jetson-orin-nano-8gb")
    stranger = make_keys(root / "stranger")
    with pytest.raises(SignatureError):
        edgesdk.verify_bundle(bundle, trusted_publishers=stranger.publisher_pub)


def test_package_refuses_what_it_cannot_do(setup) -> None:
    root, keys, convert = setup
    common = {"version": "1.0.0", "publisher_key": keys.publisher_key, "out": root / "x.edgepkg"}
    with pytest.raises(UsageError, match="no recipients"):
        edgesdk.package(convert, **common)
    with pytest.raises(ProfileError, match="profile 'rpi9' not found; known:"):
        edgesdk.package(convert, recipients=[keys.device_pub], targets=["rpi9"], **common)
    with pytest.raises(UsageError, match="expires 'soon' is not a duration"):
        edgesdk.package(convert, recipients=[keys.device_pub], expires="soon", **common)
    with pytest.raises(UsageError, match="no report.json"):
        edgesdk.package(root / "keys", recipients=[keys.device_pub], **common)
    # A report read from disk does not know its directory: the message says what to pass.
    report = ConversionReport.model_validate_json((convert / "report.json").read_text())
    with pytest.raises(UsageError, match="pass the convert output directory"):
        edgesdk.package(report, recipients=[keys.device_pub], **common)
    assert not (root / "x.edgepkg").exists()


def test_load_profile_by_name_file_or_value(tmp_path: Path) -> None:
    pi = edgesdk.load_profile("rpi5-8gb")
    assert pi.name == "rpi5-8gb"
    assert edgesdk.load_profile(pi) is pi
    custom = tmp_path / "my-board.yaml"
    custom.write_text("name: my-board\nextends: rpi5-8gb\ndisplay_name: My board\n")
    assert edgesdk.load_profile(custom).name == "my-board"
    assert edgesdk.load_profile(str(custom)).extends == "rpi5-8gb"
    assert edgesdk.load_profile("my-board", profiles_dirs=[tmp_path]).name == "my-board"
    with pytest.raises(ProfileError, match="known:"):
        edgesdk.load_profile("rpi9")


def test_import_edgesdk_stays_lazy() -> None:
    # A device importing edgesdk.bundle must not pay for the toolchain or the client.
    code = (
        "import sys, edgesdk, edgesdk.bundle; "
        "print(sorted(m for m in ('edgesdk.toolchain', 'edgesdk.client', 'edgesdk.profiles') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
    assert {"convert", "package", "verify_bundle", "load_profile", "AgentClient", "AsyncAgentClient"} <= set(
        edgesdk.__all__
    )
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = edgesdk.nope  # type: ignore[attr-defined]
