"""Secure model bundles: signed, encrypted to each device, verified before use, decrypted
only in memory. The format is described in ``docs/bundle-format.md``.

Public surface::

    package_bundle(convert_dir, *, name, version, release, publisher_key, recipients, ...) -> Path
    verify_bundle(path, *, trusted_publishers, profile, installed_release, now) -> VerifiedBundle
    verify_installed_bundle(path, *, trusted_publishers, installed_front_sha256, installed_sha256, profile)
        -> VerifiedBundle        (agent start-up: the payloads were hashed at install)
    decrypt_variant(verified, variant_id, device_key) -> dict[str, bytes]
    decrypt_and_load(verified, variant_id, device_key, load) -> load(files), once the plaintext is proven
    decrypt_golden(verified, device_key) -> dict[str, np.ndarray] | None
    inspect_bundle(path) -> UnverifiedBundleInfo     (for display only; nothing is checked)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesdk.bundle.decrypt import decrypt_and_load, decrypt_golden, decrypt_variant
    from edgesdk.bundle.inspect import UnverifiedBundleInfo, inspect_bundle
    from edgesdk.bundle.packager import DEFAULT_SEGMENT_SIZE, default_release, package_bundle
    from edgesdk.bundle.verify import VerifiedBundle, verify_bundle, verify_installed_bundle

# Imported on first use (PEP 562): a device never needs the packager (host side, it reads
# conversion reports), and each module here costs start-up time on a small board.
_LAZY = {
    "decrypt_and_load": "decrypt",
    "decrypt_golden": "decrypt",
    "decrypt_variant": "decrypt",
    "UnverifiedBundleInfo": "inspect",
    "inspect_bundle": "inspect",
    "DEFAULT_SEGMENT_SIZE": "packager",
    "default_release": "packager",
    "package_bundle": "packager",
    "VerifiedBundle": "verify",
    "verify_bundle": "verify",
    "verify_installed_bundle": "verify",
}

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "UnverifiedBundleInfo",
    "VerifiedBundle",
    "decrypt_and_load",
    "decrypt_golden",
    "decrypt_variant",
    "default_release",
    "inspect_bundle",
    "package_bundle",
    "verify_bundle",
    "verify_installed_bundle",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgesdk.bundle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"edgesdk.bundle.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
