"""The reference profile travels signed (issue 41): ``package_bundle`` puts the convert dir's
reference_profile.json into the manifest, verification hands it back, a bad one is refused
with one line, and the agent reads it from an installed slot only while the slot's front is
the one staged."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.drift.monitor import installed_reference

from edgesdk.bundle import package_bundle, verify_bundle
from edgesdk.bundle.container import HEADER_SIZE, SIGNATURE_SIZE, parse_header
from edgesdk.drift.profile import write_profile
from edgesdk.drift.schema import PROFILE_FILE, ReferenceProfile
from edgesdk.errors import EdgeSDKError, SchemaError
from tests.bundle_helpers import KeySet, make_keys, resign_bundle, write_convert_dir


def _convert_dir(root: Path) -> Path:
    convert = write_convert_dir(root / "convert", {"onnx-fp32": {"model.onnx": os.urandom(1024)}})
    rng = np.random.default_rng(3)
    write_profile(
        convert,
        {"image": rng.random((64, 1, 8, 8), dtype=np.float32)},
        {"logits": rng.normal(size=(64, 10)).astype(np.float32)},
        classify=True,
        plain=True,
    )
    return convert


def _package(convert: Path, keys: KeySet, out: Path) -> Path:
    return package_bundle(
        convert,
        name="digits",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        out=out,
    )


def test_the_convert_dirs_profile_is_signed_into_the_manifest(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    convert = _convert_dir(tmp_path)
    verified = verify_bundle(_package(convert, keys, tmp_path / "b.edgepkg"), trusted_publishers=[keys.trusted()])
    written = ReferenceProfile.model_validate_json((convert / PROFILE_FILE).read_text())
    assert verified.manifest.reference == written
    assert verified.manifest.reference.outputs["logits"].classes is not None


def test_a_malformed_profile_file_is_refused_at_packaging_with_one_line(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    convert = _convert_dir(tmp_path)
    profile = json.loads((convert / PROFILE_FILE).read_text())
    profile["inputs"]["image"]["histograms"][0]["shares"][1] += 0.5  # no longer sums to 1
    (convert / PROFILE_FILE).write_text(json.dumps(profile))
    with pytest.raises(SchemaError) as refused:
        _package(convert, keys, tmp_path / "b.edgepkg")
    assert PROFILE_FILE in str(refused.value) and "\n" not in str(refused.value)


def _oversized(manifest: dict[str, Any]) -> None:
    histogram = {"edges": [float(i) for i in range(11)], "shares": [0.0] + [0.1] * 10 + [0.0]}
    tensor = {"ndim": 2, "channel_axis": -1, "min": 0, "max": 10, "histograms": [histogram] * 64}
    manifest["reference"]["inputs"] = {f"in{i}": tensor for i in range(8)}


def test_a_signed_bundle_with_an_oversized_profile_is_refused_with_one_line(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    bundle = _package(_convert_dir(tmp_path), keys, tmp_path / "b.edgepkg")
    crafted = resign_bundle(bundle, tmp_path / "big.edgepkg", keys.signer(), _oversized)
    with pytest.raises(EdgeSDKError) as refused:
        verify_bundle(crafted, trusted_publishers=[keys.trusted()])
    message = str(refused.value)
    assert "reference" in message and "over 8192" in message and "\n" not in message, message


class _Store:
    """The two calls installed_reference makes of an agent's model store."""

    def __init__(self, path: Path, sha256: str, front_sha256: str | None) -> None:
        self.path, self.info = path, {"sha256": sha256, "front_sha256": front_sha256}

    def slot_info(self, slot: str) -> dict[str, Any] | None:
        return self.info if slot == "b" else None

    def bundle_path(self, slot: str) -> Path:
        return self.path


def _front_sha256(path: Path) -> str:
    data = path.read_bytes()
    header = parse_header(data[:HEADER_SIZE], source=str(path))
    return hashlib.sha256(data[: HEADER_SIZE + header.manifest_length + SIGNATURE_SIZE]).hexdigest()


def test_the_agent_reads_the_profile_of_the_slot_serving_only_while_its_front_is_unchanged(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    bundle = _package(_convert_dir(tmp_path), keys, tmp_path / "b.edgepkg")
    sha = hashlib.sha256(bundle.read_bytes()).hexdigest()
    profile = installed_reference(_Store(bundle, sha, _front_sha256(bundle)), sha)
    assert profile is not None and "image" in profile.inputs
    assert installed_reference(_Store(bundle, sha, _front_sha256(bundle)), "0" * 64) is None  # another bundle
    with pytest.raises(EdgeSDKError, match="changed since the slot was staged"):
        installed_reference(_Store(bundle, sha, "f" * 64), sha)
