"""An initial bundle in a provisioning image is checked at build time the way the device will
check it (signature, target profile), and shipped byte for byte."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import package_bundle
from tests.bundle_helpers import make_keys, write_convert_dir
from tests.conftest import assert_one_line_error
from tests.image_helpers import require_package_index


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-bundle")
    keys = make_keys(root / "keys")
    convert = write_convert_dir(root / "convert", {"onnx-fp32": {"model.onnx": os.urandom(4096)}}, profile="rpi5-8gb")
    bundle = package_bundle(
        convert,
        name="digits",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        out=root / "digits.edgepkg",
    )
    stranger = make_keys(root / "stranger")
    return {"root": root, "keys": keys, "bundle": bundle, "stranger_pub": stranger.publisher_pub}


def build(edgesdk_cli, tmp_path: Path, profile: str, bundle: Path, publisher_pub: Path, *extra: str):
    return edgesdk_cli(
        "image", "build", "--profile", profile, "--broker", "mqtt://b.local", "--bundle", str(bundle),
        "--publisher-key", str(publisher_pub), "--out", str(tmp_path / "i.tar.gz"), *extra,
    )  # fmt: skip


def test_bundle_for_another_profile_is_refused_before_building(edgesdk_cli, signed, tmp_path: Path) -> None:
    proc = build(edgesdk_cli, tmp_path, "jetson-orin-nano-8gb", signed["bundle"], signed["keys"].publisher_pub)
    assert_one_line_error(proc, "would be refused by the device", "digits.edgepkg")
    assert not (tmp_path / "i.tar.gz").exists()


def test_bundle_by_an_untrusted_publisher_is_refused(edgesdk_cli, signed, tmp_path: Path) -> None:
    proc = build(edgesdk_cli, tmp_path, "rpi5-8gb", signed["bundle"], signed["stranger_pub"])
    assert_one_line_error(proc, "would be refused by the device")


def test_damaged_bundle_is_refused(edgesdk_cli, signed, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.edgepkg"
    data = bytearray(signed["bundle"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    proc = build(edgesdk_cli, tmp_path, "rpi5-8gb", damaged, signed["keys"].publisher_pub)
    assert_one_line_error(proc, "damaged.edgepkg")


def test_good_bundle_is_shipped_with_its_trust_anchor(edgesdk_cli, signed, tmp_path: Path) -> None:
    require_package_index()
    proc = build(edgesdk_cli, tmp_path, "rpi5-8gb", signed["bundle"], signed["keys"].publisher_pub, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "initial bundle verified: digits 1.0.0 (release 1)" in proc.stderr
    manifest = json.loads(proc.stdout)
    assert manifest["initial_bundle"] == "bundle/initial.edgepkg"
    with tarfile.open(tmp_path / "i.tar.gz") as tar:
        top = "edgesdk-image-rpi5-8gb"
        shipped = tar.extractfile(f"{top}/bundle/initial.edgepkg")
        publisher = tar.extractfile(f"{top}/overlay/etc/edgesdk/publishers/{signed['keys'].publisher_pub.name}")
        config = tar.extractfile(f"{top}/overlay/etc/edgesdk/agent.toml")
        assert shipped is not None and publisher is not None and config is not None
        assert shipped.read() == signed["bundle"].read_bytes()
        assert publisher.read() == signed["keys"].publisher_pub.read_bytes()
        assert f"/etc/edgesdk/publishers/{signed['keys'].publisher_pub.name}" in config.read().decode()
    listed = {f["path"] for f in manifest["files"]}
    assert "bundle/initial.edgepkg" in listed and "install.sh" in listed


def _trust(signed, tmp_path: Path, publisher_pub: Path, **kw) -> Path:
    from tests.trust_helpers import make_root, trust_document, write_document

    root_key, root_pub = make_root(tmp_path / "root")
    operator = make_keys(tmp_path / "operator")
    document = trust_document(
        version=1,
        root_pubs=[root_pub],
        publisher_pubs=[publisher_pub],
        operator_pubs=[operator.publisher_pub],
        signers=[root_key],
        **kw,
    )
    return write_document(document, tmp_path / "trust.json")


def build_with_trust(edgesdk_cli, tmp_path: Path, bundle: Path, trust: Path, *extra: str):
    return edgesdk_cli(
        "image", "build", "--profile", "rpi5-8gb", "--broker", "mqtt://b.local", "--bundle", str(bundle),
        "--trust-document", str(trust), "--out", str(tmp_path / "i.tar.gz"), *extra,
    )  # fmt: skip


def test_bundle_checked_against_the_trust_documents_publishers(edgesdk_cli, signed, tmp_path: Path) -> None:
    trust = _trust(signed, tmp_path, signed["stranger_pub"])  # the document trusts another publisher
    proc = build_with_trust(edgesdk_cli, tmp_path, signed["bundle"], trust)
    assert_one_line_error(proc, "would be refused by the device", "unknown publisher key")


def test_expired_trust_document_is_refused_before_building(edgesdk_cli, signed, tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    past = datetime.now(timezone.utc) - timedelta(days=1)
    trust = _trust(signed, tmp_path, signed["keys"].publisher_pub, expires_at=past)
    proc = build_with_trust(edgesdk_cli, tmp_path, signed["bundle"], trust)
    assert_one_line_error(proc, "trust document would be refused by the device", "expired")


def test_good_bundle_is_shipped_with_its_trust_document(edgesdk_cli, signed, tmp_path: Path) -> None:
    require_package_index()
    trust = _trust(signed, tmp_path, signed["keys"].publisher_pub)
    proc = build_with_trust(edgesdk_cli, tmp_path, signed["bundle"], trust)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "i.tar.gz") as tar:
        top = "edgesdk-image-rpi5-8gb"
        shipped = tar.extractfile(f"{top}/overlay/etc/edgesdk/trust.json")
        config = tar.extractfile(f"{top}/overlay/etc/edgesdk/agent.toml")
        assert shipped is not None and config is not None
        assert shipped.read() == trust.read_bytes()
        assert 'trust_document = "@ROOT@/etc/edgesdk/trust.json"' in config.read().decode()
