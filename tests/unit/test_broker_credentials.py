"""Per-device broker passwords: the mosquitto hash, the password file, sealing to the device key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.broker_credentials import accept_credentials, open_credentials

from edgesdk.errors import EnrollmentError
from edgesdk.fleet.broker_credentials import (
    PASSWORD_LENGTH,
    DevicePasswordFile,
    issue_device_credentials,
    mosquitto_password_hash,
    mosquitto_password_matches,
)
from tests.broker_password_helpers import find_mosquitto_passwd


def test_our_hash_is_the_mosquitto_2_format_and_verifies() -> None:
    hashed = mosquitto_password_hash("s3cret", salt=b"\x01" * 12)
    assert hashed.startswith("$7$101$AQEBAQEBAQEBAQEB$")
    assert mosquitto_password_matches("s3cret", hashed)
    assert not mosquitto_password_matches("s3cret!", hashed)


def test_we_read_what_mosquitto_passwd_writes(tmp_path: Path) -> None:
    tool = find_mosquitto_passwd()
    if tool is None:
        pytest.skip("mosquitto_passwd is not installed (apt-get install mosquitto)")
    path = tmp_path / "p"
    path.write_text("")
    subprocess.run([tool, "-b", str(path), "dev-1", "hello"], check=True)
    hashed = DevicePasswordFile(path).entries()["dev-1"]
    assert mosquitto_password_matches("hello", hashed) and not mosquitto_password_matches("hell", hashed)


def test_password_file_adds_replaces_and_removes_lines(tmp_path: Path) -> None:
    passwords = DevicePasswordFile(tmp_path / "devices.passwd")
    passwords.set_password("dev-1", "one")
    passwords.set_password("dev-2", "two")
    passwords.set_password("dev-1", "uno")
    entries = passwords.entries()
    assert sorted(entries) == ["dev-1", "dev-2"] and mosquitto_password_matches("uno", entries["dev-1"])
    assert passwords.path.stat().st_mode & 0o777 == 0o600
    assert passwords.remove("dev-1") and not passwords.remove("dev-1")
    assert list(passwords.entries()) == ["dev-2"]


def test_a_malformed_password_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p"
    path.write_text("dev-1:$7$101$x$y\nnot a line\n")
    with pytest.raises(EnrollmentError, match=r"p:2"):
        DevicePasswordFile(path).entries()


def test_issued_credentials_open_only_with_the_approved_key_for_the_right_device(tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()
    passwords = DevicePasswordFile(tmp_path / "devices.passwd")
    message = issue_device_credentials("cam-1", key.public_key(), passwords).model_dump_json().encode()
    username, password = open_credentials(message, "cam-1", key)
    assert username == "cam-1" and len(password) == PASSWORD_LENGTH
    assert mosquitto_password_matches(password, passwords.entries()["cam-1"])
    with pytest.raises(EnrollmentError, match="another key"):
        open_credentials(message, "cam-1", X25519PrivateKey.generate())
    with pytest.raises(EnrollmentError, match="'cam-2'"):
        open_credentials(message, "cam-2", key)  # a message for another device is not ours
    stored = accept_credentials(message, "cam-1", key, tmp_path / "data")
    assert stored.read_text().strip() == password and stored.stat().st_mode & 0o777 == 0o600


def test_issuing_again_replaces_the_password(tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()
    passwords = DevicePasswordFile(tmp_path / "devices.passwd")
    first = open_credentials(
        issue_device_credentials("cam-1", key.public_key(), passwords).model_dump_json().encode(), "cam-1", key
    )
    second = open_credentials(
        issue_device_credentials("cam-1", key.public_key(), passwords).model_dump_json().encode(), "cam-1", key
    )
    assert first[1] != second[1]
    hashed = passwords.entries()["cam-1"]
    assert mosquitto_password_matches(second[1], hashed) and not mosquitto_password_matches(first[1], hashed)


@pytest.mark.parametrize("reserved", ["fleet-operator", "edgesdk-enroll"])
def test_reserved_accounts_are_refused(tmp_path: Path, reserved: str) -> None:
    passwords = DevicePasswordFile(tmp_path / "devices.passwd")
    with pytest.raises(EnrollmentError, match=f"'{reserved}'"):
        issue_device_credentials(reserved, X25519PrivateKey.generate().public_key(), passwords)
    assert passwords.entries() == {}


def test_garbage_credentials_are_an_enrollment_error() -> None:
    with pytest.raises(EnrollmentError):
        open_credentials(b"{", "cam-1", X25519PrivateKey.generate())
