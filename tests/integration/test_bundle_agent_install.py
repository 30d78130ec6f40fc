"""Every bad bundle of issue 4, handed to the real ``edge-agent install``: one clear error
line, a non-zero exit, and nothing installed (slots and store.json byte for byte unchanged)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgesdk.bundle import inspect_bundle, package_bundle
from edgesdk.keys import load_publisher_private_key
from tests import agent_helpers
from tests.bundle_helpers import make_digits_convert_dir, make_keys, resign_bundle
from tests.conftest import assert_one_line_error

pytest.importorskip("onnxruntime")

INSTALLED_RELEASE = 5


@pytest.fixture(scope="module")
def device(digits, request, tmp_path_factory):
    convert = make_digits_convert_dir(
        digits, Path(request.config.cache.mkdir("edgesdk-agent-digits-convert-v1")) / "out"
    )
    device = agent_helpers.make_device(tmp_path_factory.mktemp("agent-install"))
    good = device.bundle(convert, version="1.0.0", release=INSTALLED_RELEASE)
    proc = agent_helpers.run_agent_cli("install", "--config", str(device.config), "--no-reload", str(good))
    assert proc.returncode == 0, proc.stderr
    return device, convert, good


def snapshot(data_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file() and (p.name == "store.json" or "slots" in p.parts)
    }


def bad_bundle(case: str, device, convert: Path, tmp: Path) -> Path:
    out = tmp / f"{case}.edgepkg"
    signer = load_publisher_private_key(device.publisher_key)

    def package(**kwargs) -> Path:
        options = {"name": "digits", "version": "1.1.0", "release": INSTALLED_RELEASE + 1,
                   "publisher_key": device.publisher_key, "recipients": [device.device_pub],
                   "targets": ["rpi5-8gb"], "out": out} | kwargs  # fmt: skip
        return package_bundle(convert, **options)

    if case == "tampered-manifest":
        data = package().read_bytes()
        out.write_bytes(data.replace(b'"release":6', b'"release":7', 1))
    elif case == "flipped-payload-byte":
        data = bytearray(package().read_bytes())
        data[len(data) // 2] ^= 0x10
        out.write_bytes(bytes(data))
    elif case == "truncated":
        data = package().read_bytes()
        out.write_bytes(data[: len(data) - 1000])
    elif case == "wrong-device-key":
        package(recipients=[make_keys(tmp / "other").device_pub])
    elif case == "unknown-publisher":
        package(publisher_key=make_keys(tmp / "stranger").publisher_key)
    elif case == "expired":
        package(now=datetime.now(timezone.utc) - timedelta(days=10), expires=timedelta(days=1))
    elif case == "older-release":
        package(release=INSTALLED_RELEASE - 1)
    elif case == "same-release":
        package(release=INSTALLED_RELEASE)
    elif case == "other-profile":
        package(targets=["jetson-nano"])
    elif case == "path-traversal":
        resign_bundle(package(), out, signer, lambda m: m["variants"][0]["files"][0].update(name="../../etc/x"))
    elif case == "larger-than-declared":

        def shrink(m: dict) -> None:
            m["variants"][0]["size"] = 10
            m["variants"][0]["files"][0]["size"] = 10

        resign_bundle(package(), out, signer, shrink)
    return out


CASES = [
    ("tampered-manifest", "signature does not verify"),
    ("flipped-payload-byte", "does not match its signed SHA-256"),
    ("truncated", "truncated"),
    ("wrong-device-key", "not encrypted for device key"),
    ("unknown-publisher", "signed by unknown publisher key"),
    ("expired", "bundle expired at"),
    ("older-release", f"release {INSTALLED_RELEASE - 1} is below this device's rollback floor {INSTALLED_RELEASE}"),
    ("same-release", f"release {INSTALLED_RELEASE} is not newer"),
    ("other-profile", "not this device's profile 'rpi5-8gb'"),
    ("path-traversal", "files.0.name"),
    ("larger-than-declared", "10 plaintext bytes encrypt to 26"),
]


@pytest.mark.parametrize(("case", "needle"), CASES, ids=[c[0] for c in CASES])
def test_bad_bundle_installs_nothing(device, tmp_path, case: str, needle: str) -> None:
    dev, convert, _ = device
    path = bad_bundle(case, dev, convert, tmp_path)
    before = snapshot(dev.data_dir)
    proc = agent_helpers.run_agent_cli("install", "--config", str(dev.config), "--no-reload", str(path))
    assert_one_line_error(proc, needle)
    assert snapshot(dev.data_dir) == before


def test_a_good_newer_bundle_still_installs(device, tmp_path) -> None:
    dev, convert, _ = device
    newer = package_bundle(convert, name="digits", version="1.2.0", release=INSTALLED_RELEASE + 10,
                           publisher_key=dev.publisher_key, recipients=[dev.device_pub], targets=["rpi5-8gb"],
                           out=tmp_path / "newer.edgepkg")  # fmt: skip
    proc = agent_helpers.run_agent_cli("install", "--config", str(dev.config), "--no-reload", str(newer))
    assert proc.returncode == 0, proc.stderr
    assert inspect_bundle(newer).manifest.model.release == INSTALLED_RELEASE + 10
