"""``edgesdk capture keygen|decrypt`` (issue 41): the operator's key is never overwritten, and a
file that is not a capture file, a changed one or a bad key file is one clear line."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np

from edgesdk.capture.operator_key import generate_capture_key
from edgesdk.capture.record import pack_record
from edgesdk.capture.sealed import seal
from edgesdk.keys import load_device_public_key
from tests.conftest import assert_one_line_error


def test_capture_keygen_writes_a_private_key_0600_and_never_overwrites_it(tmp_path: Path, edgesdk_cli) -> None:
    made = edgesdk_cli("capture", "keygen", "--out", str(tmp_path / "k"), "--json")
    assert made.returncode == 0, made.stderr
    private = tmp_path / "k" / "capture.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    before = private.read_bytes()
    assert_one_line_error(edgesdk_cli("capture", "keygen", "--out", str(tmp_path / "k")), "already exists")
    assert private.read_bytes() == before


def test_capture_decrypt_refuses_a_changed_file_a_non_capture_file_and_a_public_key(
    tmp_path: Path, edgesdk_cli
) -> None:
    private, public = generate_capture_key(tmp_path / "k")
    sealed = seal(pack_record({"x": np.ones(4)}, {"y": np.zeros(2)}, {"model": "m"}), load_device_public_key(public))
    changed = bytearray(sealed)
    changed[-1] ^= 1
    (tmp_path / "changed.edgecap").write_bytes(bytes(changed))
    refused = edgesdk_cli("capture", "decrypt", str(tmp_path / "changed.edgecap"), "--operator-key", str(private))
    assert_one_line_error(refused, "changed.edgecap", "changed or truncated")
    refused = edgesdk_cli("capture", "decrypt", str(public), "--operator-key", str(private))
    assert_one_line_error(refused, "capture.pub", "not a capture file")
    (tmp_path / "good.edgecap").write_bytes(sealed)
    refused = edgesdk_cli("capture", "decrypt", str(tmp_path / "good.edgecap"), "--operator-key", str(public))
    assert_one_line_error(refused, "--operator-key", "capture.pub")
