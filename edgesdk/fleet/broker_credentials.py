"""Per-device broker passwords, issued when the operator approves a device.

The broker (mosquitto with ``use_username_as_clientid``) ties a connection's client id to its
username, and its ACL ties the username to ``devices/<username>/…``. So the username must be
something only that device can log in as: here, its device id with a random password that the
operator makes at approval and that only that device can read.

* The password is 32 random characters (~190 bits); it is written to the broker's device
  password file as a mosquitto PBKDF2-SHA512 hash (the ``$7$`` format of mosquitto 2.x,
  the same as ``mosquitto_passwd`` writes) and sent to the device wrapped for the X25519 key
  the operator just approved (the bundle key-slot construction), retained on
  ``devices/{id}/enroll/credentials``. Whoever substituted the announced key would have been
  caught by the key-id check of the approval; whoever reads the topic learns nothing.
* Revocation removes the device's line; the broker forgets it on its next reload (SIGHUP).

The password file holds device lines only. Operator accounts live in another file on another
listener (see firmware_images/mosquitto/): a device password must never open a listener where
client ids are not bound to usernames.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import secrets
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from edgesdk.bundle.key_slots import wrap_content_key
from edgesdk.errors import EnrollmentError
from edgesdk.schemas.messages import MqttCredentials

if TYPE_CHECKING:
    from edgesdk.mqtt.client import ClientOptions

#: Broker accounts that are not devices (the shipped ACL gives them other rights): a device
#: announcing one of these ids must never be issued its credentials.
RESERVED_USERNAMES = frozenset({"fleet-operator", "edgesdk-enroll"})

#: Characters in an issued password; exactly 32 bytes, the size a key slot wraps.
PASSWORD_LENGTH = 32

# mosquitto_passwd (2.0) writes 101 iterations with a 12-byte salt; the broker reads the count
# from each line. Stretching adds nothing to a 190-bit random password, so we match the tool.
_PBKDF2_ITERATIONS = 101
_SALT_BYTES = 12


def new_password() -> str:
    """A fresh random broker password (URL-safe base64, 32 characters)."""
    password = secrets.token_urlsafe(24)
    if len(password) != PASSWORD_LENGTH:  # token_urlsafe(24) is always 32; guard the key-slot size
        raise EnrollmentError(f"generated password has {len(password)} characters, not {PASSWORD_LENGTH}")
    return password


def mosquitto_password_hash(password: str, *, salt: bytes | None = None, iterations: int = _PBKDF2_ITERATIONS) -> str:
    """The mosquitto 2.x password-file hash of ``password``: ``$7$ITER$SALT$PBKDF2-SHA512``."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def mosquitto_password_matches(password: str, hashed: str) -> bool:
    """Whether ``hashed`` (a ``$7$`` line part) is the hash of ``password``."""
    parts = hashed.split("$")
    if len(parts) != 5 or parts[1] != "7":
        raise EnrollmentError(f"password hash {hashed[:16]!r}… is not a mosquitto $7$ (PBKDF2-SHA512) hash")
    iterations, salt, digest = int(parts[2]), base64.b64decode(parts[3]), base64.b64decode(parts[4])
    return hmac.compare_digest(hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations), digest)


def check_device_username(device_id: str) -> None:
    """Refuse ids that would log in as a broker account with more rights than a device."""
    if device_id in RESERVED_USERNAMES:
        raise EnrollmentError(
            f"device id {device_id!r} is a reserved broker account ({', '.join(sorted(RESERVED_USERNAMES))}); "
            "a device with that id would get that account's rights: refuse it"
        )


class DevicePasswordFile:
    """The broker's device password file (``user:hash`` lines); changes are locked and atomic."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def entries(self) -> dict[str, str]:
        """username → hash; an absent file has none."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise EnrollmentError(f"cannot read broker password file {self.path}: {exc.strerror or exc}") from exc
        entries: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            user, sep, hashed = line.partition(":")
            if not sep:
                raise EnrollmentError(f"{self.path}:{number}: not a 'user:hash' line: {line[:40]!r}")
            entries[user] = hashed
        return entries

    def set_password(self, username: str, password: str) -> None:
        """Add or replace ``username``'s line."""
        with self._locked() as entries:
            entries[username] = mosquitto_password_hash(password)
            self._save(entries)

    def remove(self, username: str) -> bool:
        """Remove ``username``'s line; False when it had none."""
        with self._locked() as entries:
            if entries.pop(username, None) is None:
                return False
            self._save(entries)
            return True

    @contextmanager
    def _locked(self) -> Iterator[dict[str, str]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two approvals at once must not lose a line
            yield self.entries()

    def _save(self, entries: dict[str, str]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            # Hashes only, but still nobody's business but the broker's.
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(f"{user}:{hashed}\n" for user, hashed in sorted(entries.items()))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def issue_device_credentials(
    device_id: str,
    device_key: X25519PublicKey,
    password_file: DevicePasswordFile,
    *,
    now: datetime | None = None,
) -> MqttCredentials:
    """Make ``device_id`` a new broker password, record its hash, and wrap it for ``device_key``.

    Issuing again replaces the old password (the old one stops working at the broker's next
    reload), so a re-approved or re-flashed device simply gets a new one.
    """
    check_device_username(device_id)
    password = new_password()
    password_file.set_password(device_id, password)
    return MqttCredentials(
        device_id=device_id,
        username=device_id,
        issued_at=now or datetime.now(timezone.utc),
        password=wrap_content_key(password.encode(), device_key),
    )


def publish_credentials(
    options: ClientOptions, namespace: str, credentials: MqttCredentials, *, timeout_s: float = 10.0
) -> None:
    """Retain ``credentials`` on the device's ``enroll/credentials`` topic; waits for the PUBACK."""
    from edgesdk.mqtt.client import MqttClient
    from edgesdk.protocol import topics

    topic = topics.device_topic(namespace, credentials.device_id, topics.ENROLL_CREDENTIALS)
    acked = threading.Event()
    outcome: dict[str, bool] = {}
    client = MqttClient(options)

    def on_published(mid: int, ok: bool) -> None:
        outcome[str(mid)] = ok
        acked.set()

    client.on_published = on_published
    client.start()
    try:
        if not client.wait_connected(timeout_s):
            reason = client.stats.last_error or "no answer"
            raise EnrollmentError(f"cannot reach broker {options.broker_url} to deliver credentials: {reason}")
        mid = client.publish(topic, credentials.model_dump_json().encode(), qos=1, retain=True)
        if not acked.wait(timeout_s) or not outcome.get(str(mid), False):
            raise EnrollmentError(
                f"broker {options.broker_url} did not accept the credentials on {topic!r} "
                "(does the operator account have write access there?)"
            )
    finally:
        client.stop(graceful=True)
