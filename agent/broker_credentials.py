"""The device's side of its broker credentials: open the password the operator issued, keep it.

At approval the operator retains an :class:`~edgesdk.schemas.messages.MqttCredentials` on
``devices/{id}/enroll/credentials``: the device's broker password wrapped for its X25519
key (see :mod:`edgesdk.fleet.broker_credentials`). The device opens it with its private key,
writes it 0600 into its data directory and from then on connects with ``mqtt.username`` = its
device id and ``mqtt.password_file`` = that file. Opening needs the private key, so it runs
wherever the key may be loaded (the unseal helper, ``edge-agent``), not in the serving daemon.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.bundle.key_slots import unwrap_content_key
from edgesdk.errors import DecryptionError, EnrollmentError, SchemaError
from edgesdk.schemas.messages import MqttCredentials

#: Where the device keeps its broker password (``mqtt.password_file`` points here).
PASSWORD_FILE_NAME = "mqtt.password"


def open_credentials(payload: bytes, device_id: str, device_key: X25519PrivateKey) -> tuple[str, str]:
    """(username, password) from a credentials message addressed to this device and key."""
    try:
        message = MqttCredentials.parse_json_clear(payload, source="broker credentials")
    except SchemaError as exc:
        raise EnrollmentError(str(exc)) from exc
    if message.device_id != device_id or message.username != device_id:
        # The broker binds the client id to the username: any other name would not be ours.
        raise EnrollmentError(
            f"broker credentials are for device {message.device_id!r} (user {message.username!r}), "
            f"not for this device {device_id!r}"
        )
    try:
        password = unwrap_content_key([message.password], device_key).decode("ascii")
    except (DecryptionError, UnicodeDecodeError) as exc:
        raise EnrollmentError(
            f"broker credentials for {device_id!r} do not open with this device's key: {exc}; "
            "the operator approved another key — compare the key ids"
        ) from exc
    return message.username, password


def store_credentials(data_dir: Path, password: str) -> Path:
    """Write the password (0600, atomically) into ``data_dir``; returns the file's path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    target = data_dir / PASSWORD_FILE_NAME
    fd, tmp = tempfile.mkstemp(prefix=f".{PASSWORD_FILE_NAME}.", dir=data_dir)
    try:
        os.fchmod(fd, 0o600)  # before a single byte of the secret is written
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(password + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def accept_credentials(payload: bytes, device_id: str, device_key: X25519PrivateKey, data_dir: Path) -> Path:
    """Open the credentials message and keep the password; returns ``mqtt.password_file``'s path."""
    _, password = open_credentials(payload, device_id, device_key)
    return store_credentials(data_dir, password)
