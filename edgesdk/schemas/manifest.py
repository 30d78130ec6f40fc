"""BundleManifest: the signed description of everything inside a model bundle.

The manifest is what a device verifies before it reads any payload: which variants there
are, the hash and size of each (plaintext and ciphertext), their input/output signatures
including int8 quantization parameters, how each did against its accuracy gate, who
published it, which profiles it targets, and a monotonic release counter for anti-rollback.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edgesdk.drift.schema import ReferenceProfile
from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.pipeline import Pipeline

SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)
SHA256_PATTERN = r"^[0-9a-f]{64}$"
#: Names of payloads inside a bundle: a flat name, no path separators, no dot-files.
PAYLOAD_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

#: A file inside a variant: relative path of flat components ("model.onnx",
#: "model.mlpackage/Data/weights.bin"); no "..", no absolute path, no dot-files, no backslash.
VARIANT_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,15}$"
HEX32_PATTERN = r"^[0-9a-f]{32}$"
HEX64_PATTERN = r"^[0-9a-f]{64}$"

Dim = int | str | None  # int: fixed; str: named dynamic axis ("batch"); None: unknown


class QuantParams(Schema):
    """Affine quantization of a tensor: real = scale * (q - zero_point)."""

    scale: list[float] = Field(min_length=1)
    zero_point: list[int] = Field(min_length=1)
    axis: int | None = Field(None, description="per-channel axis; None for per-tensor")


class TensorSpec(Schema):
    name: str
    dtype: str = Field(description="numpy dtype name: float32, float16, int8, uint8, int32, int64, bool")
    shape: list[Dim]
    quantization: QuantParams | None = None

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        known = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}
        if v not in known:
            raise ValueError(f"unknown dtype {v!r}; known: {', '.join(sorted(known))}")
        return v


class VariantFile(Schema):
    """One file of a variant (e.g. model.xml and model.bin of an OpenVINO IR)."""

    name: str = Field(pattern=VARIANT_FILE_PATTERN, description="relative path, as the runtime loader expects it")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_PATTERN, description="of the plaintext file")


#: A variant's place on the governor's ladder (see ShippedVariant.ladder_role).
LadderRole = Literal["reference", "speed", "size-only", "off"]


class AccuracyResult(Schema):
    """How a variant did against the reference model on validation data."""

    metric: Literal["top1", "cosine", "max_abs"]
    value: float
    gate: float
    passed: bool
    samples: int = Field(ge=0)
    max_abs_diff: dict[str, float] = Field(default_factory=dict, description="per output name")
    note: str = ""
    lower_bound: float | None = Field(
        None, description="one-sided 95% lower confidence bound of value (Wilson for top1, bootstrap for cosine)"
    )
    verdict: Literal["pass", "fail", "inconclusive"] | None = Field(
        None, description="the gate read on lower_bound: inconclusive = the value holds it, the bound does not"
    )
    samples_needed: int | None = Field(None, description="validation samples at which this value would pass its bound")


class Variant(Schema):
    """One artifact of the model: a format at a precision, for a runtime."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="e.g. 'onnx-int8'")
    format: ModelFormat
    precision: Precision
    runtime: RuntimeName
    payload: str = Field(pattern=PAYLOAD_NAME_PATTERN, description="payload name inside the bundle")
    size: int = Field(ge=0, description="plaintext size in bytes")
    sha256: str = Field(pattern=SHA256_PATTERN, description="of the plaintext artifact")
    encrypted_size: int = Field(ge=0)
    encrypted_sha256: str = Field(pattern=SHA256_PATTERN)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    accuracy: AccuracyResult | None = None
    quantization_method: str | None = Field(None, description="e.g. 'static-qdq-per-channel', 'nncf-ptq'")
    load_rss_mb: float | None = Field(
        None,
        ge=0,
        description="peak RSS growth while the converter's validation loaded and ran it (MB, packaging host); "
        "the agent checks it against the device's model memory budget at install. None: older bundles",
    )
    ladder_role: LadderRole | None = Field(
        None,
        description="reference/speed: a governor step; size-only: slower than the reference on the device's CPU "
        "class, not a speed step; off: never on the ladder (unvalidated). None: older bundles (a step)",
    )
    files: list[VariantFile] = Field(
        default_factory=list,
        description="the files of the variant, in payload order: the plaintext payload is their concatenation",
    )

    @model_validator(mode="after")
    def _files_add_up(self) -> Variant:
        if self.files:
            names = [f.name for f in self.files]
            if len(set(names)) != len(names):
                raise ValueError(f"variant {self.id!r}: file names repeat: {names}")
            total = sum(f.size for f in self.files)
            if total != self.size:
                raise ValueError(f"variant {self.id!r}: files add up to {total} bytes, size says {self.size}")
        return self


class Golden(Schema):
    """Reference inputs and outputs for the on-device smoke test (an .npz payload)."""

    payload: str = Field(pattern=PAYLOAD_NAME_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)
    encrypted_size: int = Field(ge=0)
    encrypted_sha256: str = Field(pattern=SHA256_PATTERN)
    metric: Literal["top1", "cosine", "max_abs"] = "top1"
    gate: float = 0.99


class KeySlot(Schema):
    """The bundle's content key, wrapped for one recipient (X25519 + HKDF-SHA256 + AES-256-GCM)."""

    recipient: str = Field(pattern=HEX32_PATTERN, description="key id of the recipient's X25519 public key")
    kind: Literal["device", "group"] = "device"
    ephemeral_public: str = Field(pattern=HEX64_PATTERN, description="the sender's one-time X25519 public key")
    wrapped_key: str = Field(pattern=r"^[0-9a-f]{96}$", description="AES-256-GCM(wrap key, content key) + tag")


class PayloadLocation(Schema):
    """Where one encrypted payload sits in the container's payload area."""

    name: str = Field(pattern=PAYLOAD_NAME_PATTERN)
    offset: int = Field(ge=0, description="from the start of the payload area")
    length: int = Field(ge=0, description="ciphertext bytes")
    salt: str = Field(pattern=HEX32_PATTERN, description="HKDF salt of this payload's key")


class BundleEncryption(Schema):
    """How the payloads are encrypted, and for whom. Signed with the rest of the manifest."""

    scheme: Literal["edgesdk-stream-aes256gcm-v1"] = "edgesdk-stream-aes256gcm-v1"
    segment_size: int = Field(ge=4096, le=16 * 1024 * 1024, description="plaintext bytes per AEAD segment")
    key_slots: list[KeySlot] = Field(min_length=1, max_length=4096)
    payloads: list[PayloadLocation] = Field(min_length=1, max_length=1024)


class Publisher(Schema):
    name: str
    key_id: str = Field(pattern=r"^[0-9a-f]{16,64}$", description="sha256 prefix of the Ed25519 public key")


class ModelInfo(Schema):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    version: str = Field(pattern=SEMVER_PATTERN)
    release: int = Field(ge=1, description="monotonic release counter used for anti-rollback")
    description: str = ""


class DowngradePermission(Schema):
    """A publisher-signed permission to install this (older) release over a device whose
    rollback floor lies in ``from_releases``, until ``expires_at``. Part of the signed
    manifest, so neither the range nor the expiry can be changed without the publisher key."""

    from_releases: tuple[int, int] = Field(description="[min, max] of the device floors this downgrade may replace")
    expires_at: datetime = Field(description="after this moment the permission is void (timezone-aware)")

    @model_validator(mode="after")
    def _bounded(self) -> DowngradePermission:
        low, high = self.from_releases
        if low < 1 or high < low:
            raise ValueError(f"from_releases must be [min, max] with 1 <= min <= max, got [{low}, {high}]")
        if self.expires_at.tzinfo is None:
            raise ValueError("expires_at needs a timezone (e.g. 2026-05-01T00:00:00Z)")
        return self


class BundleManifest(Schema):
    """The signed table of contents of a model bundle."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelInfo
    publisher: Publisher
    created: datetime
    expires: datetime | None = None
    targets: list[str] = Field(min_length=1, description="device profile names this bundle is for")
    variants: list[Variant] = Field(min_length=1)
    golden: Golden | None = None
    allow_downgrade: bool | None = Field(
        None,
        description="the unbounded permission of older manifests; read so they still load, never honoured "
        "(edgesdk no longer writes it): use `downgrade`",
    )
    downgrade: DowngradePermission | None = Field(
        None, description="signed, bounded and expiring permission to install over a newer release"
    )
    encryption: BundleEncryption | None = Field(
        None, description="key slots and payload layout; every bundle edgesdk writes has it"
    )
    pipeline: Pipeline | None = Field(
        None, description="pre/post-processing for POST /v1/models/{name}/predict, signed with the model"
    )
    reference: ReferenceProfile | None = Field(
        None, description="the validation data's profile the device measures drift against (edgesdk.drift)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> BundleManifest:
        ids = [v.id for v in self.variants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"variant ids repeat: {ids}")
        payloads = [v.payload for v in self.variants] + ([self.golden.payload] if self.golden else [])
        if len(set(payloads)) != len(payloads):
            raise ValueError(f"payload names repeat: {payloads}")
        if self.expires is not None and self.expires <= self.created:
            raise ValueError("expires must be after created")
        if self.downgrade is not None:
            low, _ = self.downgrade.from_releases
            if self.model.release >= low:
                raise ValueError(
                    f"downgrade.from_releases starts at {low}: a downgrade goes to an older release, "
                    f"but this bundle is release {self.model.release}"
                )
        return self

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        raise KeyError(variant_id)
