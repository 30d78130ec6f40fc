"""Where a bundle is verified and decrypted for an update or a sideload: in the unseal helper
(the default) or, with ``unseal = "in_process"``, in this process.

The updater (:class:`~edgesdk.agent.ota.target.AgentUpdateTarget`) opens one
:class:`~edgesdk.agent.ports.BundleOpener` per state that needs the keys (verify, stage,
activate, roll back) and closes it when that state's work is done. With the helper, the device
private key and the ``cryptography`` library are in a child process only while that work runs,
never in the daemon; the plaintext reaches the daemon over a pipe, checked against the signed
hash, exactly as at start (:mod:`edgesdk.agent.unseal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgesdk.agent.ports import BundleOpener, Keyring, Serving

if TYPE_CHECKING:
    from edgesdk.agent.serving import ServedModel
    from edgesdk.agent.unseal import Unsealer

OpenerFactory = Callable[[], BundleOpener]


class InProcessOpener:
    """Verifies and decrypts here, with the keyring's key objects (``unseal = "in_process"``)."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    def verify(
        self, path: Path, *, profile: str | None, installed_release: int | None, rollback_floor: int | None = None
    ) -> Any:
        from edgesdk.bundle import verify_bundle

        return verify_bundle(
            path,
            trusted_publishers=self.keyring.trusted_publishers,
            profile=profile,
            installed_release=installed_release,
            rollback_floor=rollback_floor,
        )

    def decrypt(self, bundle: Any, variant_id: str) -> dict[str, bytes]:
        from edgesdk.bundle import decrypt_variant

        return decrypt_variant(bundle, variant_id, self.keyring.device_key)

    def golden(self, bundle: Any) -> dict[str, Any] | None:
        from edgesdk.bundle import decrypt_golden

        return decrypt_golden(bundle, self.keyring.device_key)

    def serve(self, serving: Serving, bundle: Any) -> ServedModel:
        return serving.swap(bundle, self.keyring.device_key)

    def close(self) -> None:
        return None


class HelperOpener:
    """Verifies and decrypts in one unseal helper process, started on first use."""

    def __init__(self, *, publisher_keys: Sequence[Path], device_key: Path, trust_document: Path | None = None) -> None:
        from edgesdk.agent.unseal import Unsealer

        self.unsealer: Unsealer = Unsealer(
            publisher_keys=publisher_keys, device_key=device_key, trust_document=trust_document
        )

    def verify(
        self, path: Path, *, profile: str | None, installed_release: int | None, rollback_floor: int | None = None
    ) -> Any:
        return self.unsealer.verify(
            path, profile=profile, installed_release=installed_release, rollback_floor=rollback_floor
        )

    def decrypt(self, bundle: Any, variant_id: str) -> dict[str, bytes]:
        return self.unsealer.decrypt(bundle, variant_id)

    def golden(self, bundle: Any) -> dict[str, Any] | None:
        return self.unsealer.golden(bundle)

    def serve(self, serving: Serving, bundle: Any) -> ServedModel:
        return serving.swap(bundle, None, decrypt=self.unsealer.decrypt)

    def close(self) -> None:
        self.unsealer.close()


def opener_factory(
    unseal: Literal["helper", "in_process"],
    keyring: Keyring,
    *,
    publisher_keys: Sequence[Path],
    device_key: Path,
    trust_document: Callable[[], Path] | None = None,
) -> OpenerFactory:
    """What the agent hands its updater: a new opener of the configured kind per piece of work.

    ``trust_document`` gives the trust document in force when a helper starts, so a helper
    started after a rotation verifies against the new publisher keys."""
    if unseal == "in_process":
        return lambda: InProcessOpener(keyring)
    helper_keys, helper_device_key = list(publisher_keys), device_key
    return lambda: HelperOpener(
        publisher_keys=helper_keys,
        device_key=helper_device_key,
        trust_document=trust_document() if trust_document is not None else None,
    )
