"""The agent's keys, read from their files on first use.

With ``unseal = "helper"`` (the default) the daemon's start never needs the key objects: the
helper process reads the key files. OTA updates, a sideload into the running daemon and the
fleet link do, and import the crypto library then — so nothing here imports it before.
"""

from __future__ import annotations

import base64
import functools
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.trust import AgentTrust


class KeyFiles:
    """The device key and the trusted keys per role of one agent (the ``Keyring`` port).

    With a trust document (``trust``), bundles verify against its publisher keys and
    deployments against its operator keys, and ``publisher_key_paths`` is not used. Without
    one, the configured publisher keys verify both: the roles are not separated (the daemon
    warns), as before trust documents existed."""

    def __init__(
        self, device_key_path: Path, publisher_key_paths: Sequence[Path], trust: AgentTrust | None = None
    ) -> None:
        self.device_key_path = Path(device_key_path)
        self.publisher_key_paths = [Path(p) for p in publisher_key_paths]
        self.trust = trust

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


def public_key_text(device_key: X25519PrivateKey) -> str:
    """The raw public half of ``device_key``, base64 (how presence and enrollment carry it)."""
    from cryptography.hazmat.primitives import serialization

    raw = device_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()
