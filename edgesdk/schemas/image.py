"""ImageManifest: what a provisioning image (``edgesdk image build``) contains.

Written as ``image-manifest.json`` at the top of the image. ``install.sh`` checks the files
against ``SHA256SUMS`` (plain ``sha256sum -c``, no Python needed); this manifest is the same
list with sizes plus what the image was built for, for people and tools.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.manifest import SHA256_PATTERN
from edgesdk.schemas.profile import CpuArch


class ImageFile(Schema):
    path: str = Field(description="path inside the image, '/'-separated")
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)


class ImageManifest(Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["provisioning_image"] = "provisioning_image"
    created_at: datetime
    edgesdk_version: str
    profile: str
    family: str = Field(description="firmware recipe used, e.g. raspberry-pi-os-arm64")
    arch: CpuArch
    python: str = Field(description="Python major.minor the wheelhouse was resolved for")
    wheel_platforms: list[str] = Field(description="pip --platform tags the wheelhouse was resolved with")
    requirement: str = Field(description="what install.sh installs, e.g. 'edgesdk[agent]==0.1.0'")
    wheels: list[str] = Field(description="wheel file names in wheelhouse/")
    broker: str
    has_ca: bool
    initial_bundle: str | None = Field(None, description="path of the initial bundle inside the image")
    files: list[ImageFile]
