"""The agent's keys, read from their files on first use.

With ``unseal = "helper"`` (the default) the daemon never reads the device's private key: the
unseal helper process reads the key files to open bundles (at start, on reload, for OTA
updates and sideloads), and presence and enrollment announce the public key from
``device.pub`` beside ``device.key``, parsed here without the crypto library. Only
``unseal = "in_process"`` loads :attr:`KeyFiles.device_key` into the daemon.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from edgesdk.errors import ConfigError, KeyFileError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.trust import AgentTrust


log = logging.getLogger("edgesdk.agent.keyring")

#: DER of an X25519 SubjectPublicKeyInfo up to the key: SEQUENCE, AlgorithmIdentifier
#: (OID 1.3.101.110), BIT STRING of 33 bytes (no unused bits). The 32 raw key bytes follow.
_X25519_SPKI_PREFIX = bytes.fromhex("302a300506032b656e032100")
_PEM_PUBLIC = ("-----BEGIN PUBLIC KEY-----", "-----END PUBLIC KEY-----")
_MAX_PUBLIC_FILE_BYTES = 4096


def device_public_key_path(device_key_path: Path) -> Path:
    """Where the public half of ``device_key_path`` lives: ``device.key`` → ``device.pub``
    (what :func:`edgesdk.keys.generate_device_key` writes)."""
    return Path(device_key_path).with_suffix(".pub")


def read_device_public_key(path: Path) -> bytes:
    """The raw 32-byte X25519 key of a PEM ``device.pub``, read without the crypto library."""
    try:
        data = Path(path).read_bytes()[: _MAX_PUBLIC_FILE_BYTES + 1]
    except OSError as exc:
        raise KeyFileError(f"device public key {path}: {exc.strerror or exc}") from exc
    text = data.decode("ascii", errors="replace")
    begin, end = text.find(_PEM_PUBLIC[0]), text.find(_PEM_PUBLIC[1])
    if len(data) > _MAX_PUBLIC_FILE_BYTES or begin < 0 or end < begin:
        raise KeyFileError(f"device public key {path} is not a PEM public key")
    try:
        der = base64.b64decode("".join(text[begin + len(_PEM_PUBLIC[0]) : end].split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"device public key {path}: PEM body is not base64 ({exc})") from exc
    if len(der) != len(_X25519_SPKI_PREFIX) + 32 or not der.startswith(_X25519_SPKI_PREFIX):
        raise KeyFileError(f"device public key {path} is not an X25519 (device) public key")
    return der[len(_X25519_SPKI_PREFIX) :]


def raw_key_id(raw_public_key: bytes) -> str:
    """The key id of a raw public key: what :func:`edgesdk.keys.key_id` gives for its object."""
    return hashlib.sha256(raw_public_key).digest()[:16].hex()


class KeyFiles:
    """The device key and the trusted keys per role of one agent (the ``Keyring`` port).

    With a trust document (``trust``), bundles verify against its publisher keys and
    deployments against its operator keys, and ``publisher_key_paths`` is not used. Without
    one, the configured publisher keys verify both: the roles are not separated (the daemon
    warns), as before trust documents existed. ``unseal`` says who may read the private key:
    ``"helper"`` (the daemon never does; a missing ``device.pub`` is derived once by the
    unseal helper) or ``"in_process"``."""

    def __init__(
        self,
        device_key_path: Path,
        publisher_key_paths: Sequence[Path],
        *,
        unseal: Literal["helper", "in_process"] = "helper",
        trust: AgentTrust | None = None,
    ) -> None:
        self.device_key_path = Path(device_key_path)
        self.publisher_key_paths = [Path(p) for p in publisher_key_paths]
        self.unseal = unseal
        self.trust = trust
        self._public_raw: bytes | None = None

    def device_public_key(self) -> bytes:
        """The raw public half of the device key: from ``device.pub``; without one, derived
        once (in the unseal helper unless ``unseal = "in_process"``) and kept in memory."""
        if self._public_raw is not None:
            return self._public_raw
        public_path = device_public_key_path(self.device_key_path)
        if public_path.exists():
            self._public_raw = read_device_public_key(public_path)
        elif self.unseal == "in_process":
            from cryptography.hazmat.primitives import serialization

            self._public_raw = self.device_key.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        else:
            from edgesdk.agent.unseal import Unsealer

            log.warning(
                "%s has no public key file beside it (%s): deriving it in the unseal helper; "
                "write it once with `edge-agent key > %s` so the helper is not needed for it",
                self.device_key_path,
                public_path,
                public_path,
            )
            with Unsealer(publisher_keys=[], device_key=self.device_key_path) as unsealer:
                self._public_raw = unsealer.public_key()
        return self._public_raw

    def check_files(self) -> None:
        """Each key file exists and is a regular file (ConfigError naming the one that is not)."""
        trust_files = [self.trust.path] if self.trust is not None else []
        publisher_files = self.publisher_key_paths if self.trust is None else []
        for path in [*publisher_files, *trust_files, self.device_key_path]:
            try:
                info = path.stat()
            except OSError as exc:
                raise ConfigError(f"key file {path}: {exc.strerror or exc}") from exc
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"key file {path} is not a regular file")

    @functools.cached_property
    def device_key(self) -> X25519PrivateKey:
        from edgesdk import keys

        return keys.load_device_private_key(self.device_key_path)

    @property
    def trusted_publishers(self) -> list[Ed25519PublicKey]:
        if self.trust is not None:
            return self.trust.publisher_keys()  # follows the document in force (rotation, revocation)
        return self._configured_publishers

    @property
    def trusted_operators(self) -> list[Ed25519PublicKey]:
        if self.trust is not None:
            return self.trust.operator_keys()
        return self._configured_publishers

    @functools.cached_property
    def _configured_publishers(self) -> list[Ed25519PublicKey]:
        from edgesdk import keys

        return [keys.load_publisher_public_key(path) for path in self.publisher_key_paths]


def public_key_text(raw_public_key: bytes) -> str:
    """A raw public key, base64 (how presence and enrollment carry it)."""
    return base64.b64encode(raw_public_key).decode()
