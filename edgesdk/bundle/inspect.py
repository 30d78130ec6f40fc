"""Reading a bundle's manifest WITHOUT trusting it, for ``edgesdk bundle inspect``.

Nothing here checks a signature: what it returns is for people to look at, never to act
on. Acting on a bundle goes through :func:`edgesdk.bundle.verify_bundle`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgesdk.bundle.container import ContainerHeader
from edgesdk.bundle.reader import open_bundle_file, read_front
from edgesdk.errors import BundleFormatError, SchemaError
from edgesdk.schemas.manifest import BundleManifest


@dataclass(frozen=True)
class UnverifiedBundleInfo:
    """The header and manifest of a bundle, as read; the signature is NOT checked."""

    path: Path
    header: ContainerHeader
    manifest: BundleManifest
    size: int

    @property
    def publisher_key_id(self) -> str:
        return self.header.publisher_key_id.hex()


def inspect_bundle(path: Path | str) -> UnverifiedBundleInfo:
    """Parse the container front of ``path`` (bounds checked) without verifying anything."""
    path = Path(path)
    with open_bundle_file(path) as handle:
        front = read_front(handle, source=str(path))
    try:
        manifest = BundleManifest.parse_json_clear(front.manifest_bytes, source=f"{path}: manifest")
    except SchemaError as exc:
        raise BundleFormatError(str(exc)) from exc
    return UnverifiedBundleInfo(path, front.header, manifest, front.actual_size)
