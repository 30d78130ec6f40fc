"""``package_bundle()``: a convert output dir → one signed, encrypted ``.edgepkg``.

The packager streams: each variant's files are read, encrypted and hashed segment by
segment into a ciphertext spool next to the output (ciphertext only), then the manifest,
which needs those hashes, is signed and written in front of the payloads. The result
appears under its final name only when complete (write, fsync, rename).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from edgesdk.bundle.container import (
    MAX_MANIFEST_BYTES,
    MAX_PAYLOAD_BYTES,
    ciphertext_length,
    pack_header,
    signed_message,
)
from edgesdk.bundle.key_slots import new_content_key, wrap_content_key
from edgesdk.bundle.stream_aead import PAYLOAD_SALT_SIZE, derive_payload_key, encrypt_segments
from edgesdk.drift.schema import MAX_PROFILE_BYTES, PROFILE_FILE, ReferenceProfile
from edgesdk.errors import BundleFormatError, SchemaError, UsageError
from edgesdk.keys import key_id, key_id_bytes, load_device_public_key, load_publisher_private_key
from edgesdk.schemas.manifest import (
    BundleEncryption,
    BundleManifest,
    DowngradePermission,
    Golden,
    KeySlot,
    ModelInfo,
    PayloadLocation,
    Publisher,
    Variant,
    VariantFile,
)
from edgesdk.schemas.pipeline import Pipeline, PostProcess
from edgesdk.schemas.report import ConversionReport, ShippedVariant

DEFAULT_SEGMENT_SIZE = 1024 * 1024
_READ_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class _SourceFile:
    name: str  # inside the variant, e.g. "model.onnx"
    path: Path


@dataclass(frozen=True)
class _PlainPayload:
    name: str
    files: list[_SourceFile]


@dataclass(frozen=True)
class _SealedPayload:
    """What encrypting one payload measured: its place, and the hashes for the manifest."""

    location: PayloadLocation
    size: int
    sha256: str
    encrypted_sha256: str
    files: list[VariantFile]


def default_release(now: datetime | None = None) -> int:
    """The release counter used when none is given: seconds since the Unix epoch (UTC).

    Later builds get larger counters without any shared state; CI pipelines that keep their
    own counter pass ``release=`` explicitly (and must keep using one scheme)."""
    moment = now or datetime.now(timezone.utc)
    return max(1, int(moment.timestamp()))


def _inside(root: Path, relative: str, *, what: str) -> Path:
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise UsageError(f"{what}: path {relative!r} leaves the convert dir {root}")
    path = root / candidate
    try:
        resolved = path.resolve(strict=True)
    except OSError as exc:
        raise UsageError(f"{what}: {relative!r} does not exist in {root}") from exc
    if not resolved.is_relative_to(root.resolve()):
        raise UsageError(f"{what}: {relative!r} resolves outside the convert dir {root}")
    return path


def _collect_files(root: Path, variant: ShippedVariant) -> list[_SourceFile]:
    """The variant's files with their names inside the bundle (relative to artifacts/<id>/)."""
    what = f"variant {variant.id!r}"
    base = root / "artifacts" / variant.id
    found: list[tuple[str, Path]] = []
    for relative in variant.files:
        path = _inside(root, relative, what=what)
        anchor = base if path.is_relative_to(base) else path.parent
        if path.is_dir() and not path.is_symlink():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for filename in sorted(filenames):
                    member = Path(dirpath) / filename
                    found.append((member.relative_to(anchor).as_posix(), member))
        else:
            found.append((path.relative_to(anchor).as_posix(), path))
    files: list[_SourceFile] = []
    for name, path in found:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{what}: {path} is not a regular file (symlinks and devices are not packaged)")
        files.append(_SourceFile(name, path))
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise UsageError(f"{what}: two files would have the same name in the bundle: {sorted(names)}")
    return files


def _plaintext_segments(
    files: Sequence[_SourceFile], segment_size: int, measured: list[VariantFile], whole: hashlib._Hash
) -> Iterator[bytes]:
    """The concatenated files, cut into segments of exactly ``segment_size`` (the last shorter).

    Hashes each file and the whole as it goes (one read of every file), appending to
    ``measured``; refuses a payload over the size limit before reading past it."""
    pending = bytearray()
    total = 0
    for source in files:
        digest = hashlib.sha256()
        size = 0
        with open(source.path, "rb") as handle:
            while chunk := handle.read(segment_size):
                size += len(chunk)
                total += len(chunk)
                if total > MAX_PAYLOAD_BYTES:
                    raise UsageError(f"{source.path}: payload exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
                digest.update(chunk)
                whole.update(chunk)
                pending += chunk
                while len(pending) >= segment_size:
                    yield bytes(pending[:segment_size])
                    del pending[:segment_size]
        measured.append(VariantFile(name=source.name, size=size, sha256=digest.hexdigest()))
    if pending:
        yield bytes(pending)


def _encrypt_payload(
    payload: _PlainPayload, content_key: bytes, segment_size: int, spool: BinaryIO, offset: int
) -> _SealedPayload:
    salt = os.urandom(PAYLOAD_SALT_SIZE)
    key = derive_payload_key(content_key, salt, payload.name)
    cipher_digest = hashlib.sha256()
    plain_digest = hashlib.sha256()
    measured: list[VariantFile] = []
    length = 0
    for sealed in encrypt_segments(key, _plaintext_segments(payload.files, segment_size, measured, plain_digest)):
        spool.write(sealed)
        cipher_digest.update(sealed)
        length += len(sealed)
    size = sum(f.size for f in measured)
    if length != ciphertext_length(size, segment_size):  # a bug, not bad input
        raise BundleFormatError(f"payload {payload.name!r}: {length} ciphertext bytes for {size} plaintext bytes")
    return _SealedPayload(
        location=PayloadLocation(name=payload.name, offset=offset, length=length, salt=salt.hex()),
        size=size,
        sha256=plain_digest.hexdigest(),
        encrypted_sha256=cipher_digest.hexdigest(),
        files=measured,
    )


def _as_publisher_key(key: Ed25519PrivateKey | Path | str) -> Ed25519PrivateKey:
    return key if isinstance(key, Ed25519PrivateKey) else load_publisher_private_key(key)


def _as_recipients(keys: Iterable[X25519PublicKey | Path | str]) -> list[X25519PublicKey]:
    """Loaded recipient keys, each once (a key named twice gets one slot)."""
    unique: dict[str, X25519PublicKey] = {}
    for item in keys:
        key = item if isinstance(item, X25519PublicKey) else load_device_public_key(item)
        unique.setdefault(key_id(key), key)
    return list(unique.values())


def package_bundle(
    convert_dir: Path | str,
    *,
    name: str,
    version: str,
    release: int | None = None,
    publisher_key: Ed25519PrivateKey | Path | str,
    recipients: Iterable[X25519PublicKey | Path | str],
    group_recipients: Iterable[X25519PublicKey | Path | str] = (),
    targets: Sequence[str] | None = None,
    expires: datetime | timedelta | None = None,
    downgrade: DowngradePermission | None = None,
    out: Path | str,
    publisher_name: str = "edgesdk-publisher",
    description: str = "",
    segment_size: int = DEFAULT_SEGMENT_SIZE,
    now: datetime | None = None,
    allow_unvalidated: bool = False,
    pipeline: Pipeline | None = None,
) -> Path:
    """Package the variants of ``convert_dir`` (a ``edgesdk convert`` output) into ``out``.

    Every variant file and the golden set are encrypted under one fresh content key, which
    is wrapped for each recipient (device keys and group keys); the manifest is signed with
    ``publisher_key``. ``release`` defaults to :func:`default_release`; ``targets`` to the
    report's profile; ``expires`` may be a moment or a duration from now. ``downgrade``
    signs a bounded, expiring permission to install this release over newer ones (see
    :class:`~edgesdk.schemas.manifest.DowngradePermission`). A variant that could not be run
    where it was converted (Core ML on Linux: ``validation`` unvalidated) is refused unless
    ``allow_unvalidated``; it then ships marked off the governor's ladder. ``pipeline`` (the
    pre/post-processing of ``/predict``) is signed into the manifest."""
    root = Path(convert_dir)
    report = _read_report(root, allow_unvalidated)
    if pipeline is not None:
        _labels_fit_the_classes(report, pipeline)
    signer = _as_publisher_key(publisher_key)
    device_keys = _as_recipients(recipients)
    group_keys = _as_recipients(group_recipients)
    if not device_keys and not group_keys:
        raise UsageError("no recipients: pass at least one device or group public key")
    created = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    expiry = created + expires if isinstance(expires, timedelta) else expires
    release = default_release(created) if release is None else release
    # Checked before any work, so a bad --version is one clear line, not a spent encryption pass.
    model_info = ModelInfo.parse_obj_clear(
        {"name": name, "version": version, "release": release, "description": description}, source="bundle"
    )
    if expiry is not None and expiry <= created:
        raise UsageError(f"expiry {expiry.isoformat()} is not in the future")
    payloads = _plain_payloads(root, report)

    content_key = new_content_key()
    slots: list[KeySlot] = [wrap_content_key(content_key, k, kind="device") for k in device_keys]
    slots += [wrap_content_key(content_key, k, kind="group") for k in group_keys]

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    spool_path = out_path.with_name(f".{out_path.name}.payloads.tmp")
    partial_path = out_path.with_name(f".{out_path.name}.partial")
    try:
        sealed = _seal_into_spool(payloads, content_key, segment_size, spool_path)
        shipped_sealed = zip(report.variants, sealed[: len(report.variants)], strict=True)  # golden comes last
        variants = [_variant_entry(shipped, done) for shipped, done in shipped_sealed]
        golden = _golden_entry(report, sealed[-1]) if report.golden else None
        try:
            manifest = BundleManifest(
                model=model_info,
                publisher=Publisher(name=publisher_name, key_id=key_id(signer.public_key())),
                created=created,
                expires=expiry,
                targets=list(targets) if targets else [report.profile],
                variants=variants,
                golden=golden,
                downgrade=downgrade,
                pipeline=pipeline,
                reference=_reference_profile(root),
                encryption=BundleEncryption(
                    segment_size=segment_size, key_slots=slots, payloads=[done.location for done in sealed]
                ),
            )
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise SchemaError(f"cannot build the bundle manifest: {_first_line(exc)}") from exc
        payload_area_length = sum(done.location.length for done in sealed)
        _write_signed_bundle(manifest, signer, payload_area_length, spool_path, partial_path)
        os.replace(partial_path, out_path)
    finally:
        for leftover in (spool_path, partial_path):
            leftover.unlink(missing_ok=True)
    return out_path


def _labels_fit_the_classes(report: ConversionReport, pipeline: Pipeline) -> None:
    """A classifier's or a detector's labels name its classes one by one: a list of another
    length would answer wrong names by index (or numbers past its end), so it is refused before
    any work, where the output's shape tells the class count."""
    post = pipeline.post
    if post.kind not in ("classes", "boxes") or not post.labels:
        return
    outputs = report.variants[0].outputs  # at least one (the report's schema)
    output = next((o for o in outputs if o.name == post.output), outputs[0])
    classes = _class_count(output.shape, pipeline.post)
    if classes is not None and classes != len(post.labels):
        where = (
            "" if post.kind == "classes" else f" (after the {5 if post.boxes.objectness else 4} box values of a row)"
        )
        raise UsageError(
            f"--labels: {len(post.labels)} labels for output {output.name!r} of {classes} classes{where}; "
            f"give one label a line, {classes} lines"
        )


def _class_count(shape: Sequence[object] | None, post: PostProcess) -> int | None:
    """The classes an output of ``shape`` holds as ``post`` reads it (None where a dimension is
    dynamic): a classifier's last axis; a detector's (1, N, 4 + C) rows (C columns after the
    box, and after the objectness column where there is one; (1, 4 + C, N) when transposed)."""
    if not shape:
        return None
    if post.kind == "classes":
        return shape[-1] if isinstance(shape[-1], int) else None
    if len(shape) != 3:
        return None  # /predict refuses such an output with its shape
    columns = shape[1] if post.boxes.transposed else shape[2]
    first_class = 5 if post.boxes.objectness else 4
    return columns - first_class if isinstance(columns, int) and columns > first_class else None


def _read_report(root: Path, allow_unvalidated: bool) -> ConversionReport:
    """The convert dir's report, refused when it ships nothing or (without
    ``allow_unvalidated``) a variant that was never run."""
    report_path = root / "report.json"
    if not report_path.is_file():
        raise UsageError(f"{root} is not a convert output dir (no report.json)")
    report = ConversionReport.parse_json_clear(report_path.read_bytes(), source=str(report_path))
    if not report.variants:
        raise UsageError(f"{report_path}: no shipped variants to package")
    unvalidated = [v.id for v in report.variants if v.validation != "numeric"]
    if unvalidated and not allow_unvalidated:
        raise UsageError(
            f"{report_path}: variant(s) {', '.join(unvalidated)} were never run (no numerical validation on the "
            "converting host); package them only with --allow-unvalidated (they ship off the governor's ladder)"
        )
    return report


def _plain_payloads(root: Path, report: ConversionReport) -> list[_PlainPayload]:
    """One payload per variant, then the golden set's (when the report has one)."""
    payloads = [_PlainPayload(f"{v.id}.enc", _collect_files(root, v)) for v in report.variants]
    if report.golden:
        golden_path = _inside(root, report.golden, what="golden set")
        if not golden_path.is_file():
            raise UsageError(f"golden set {golden_path} is not a regular file")
        payloads.append(_PlainPayload("golden.npz.enc", [_SourceFile("golden.npz", golden_path)]))
    return payloads


def _seal_into_spool(
    payloads: list[_PlainPayload], content_key: bytes, segment_size: int, spool_path: Path
) -> list[_SealedPayload]:
    """Every payload encrypted into the spool, one after the other (ciphertext only on disk)."""
    sealed: list[_SealedPayload] = []
    offset = 0
    with open(spool_path, "wb") as spool:
        for payload in payloads:
            sealed.append(_encrypt_payload(payload, content_key, segment_size, spool, offset))
            offset += sealed[-1].location.length
    return sealed


def _golden_entry(report: ConversionReport, done: _SealedPayload) -> Golden:
    return Golden(
        payload=done.location.name,
        sha256=done.sha256,
        size=done.size,
        encrypted_size=done.location.length,
        encrypted_sha256=done.encrypted_sha256,
        metric=report.metric,
        gate=report.gate,
    )


def _write_signed_bundle(
    manifest: BundleManifest,
    signer: Ed25519PrivateKey,
    payload_area_length: int,
    spool_path: Path,
    partial_path: Path,
) -> None:
    """Header, manifest and its signature, then the spooled payloads, written to
    ``partial_path`` and synced to disk (the caller renames it into place)."""
    manifest_bytes = manifest.model_dump_json(exclude_none=True).encode()
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise UsageError(f"manifest is {len(manifest_bytes)} bytes, over {MAX_MANIFEST_BYTES} (too many recipients?)")
    header = pack_header(
        manifest_length=len(manifest_bytes),
        publisher_key_id=key_id_bytes(signer.public_key()),
        payload_area_length=payload_area_length,
    )
    signature = signer.sign(signed_message(header, manifest_bytes))
    with open(partial_path, "wb") as target, open(spool_path, "rb") as spool:
        target.write(header + manifest_bytes + signature)
        shutil.copyfileobj(spool, target, _READ_CHUNK)
        target.flush()
        os.fsync(target.fileno())


def _reference_profile(root: Path) -> ReferenceProfile | None:
    """The convert dir's reference profile (drift on the device, issue 41), if it wrote one."""
    path = root / PROFILE_FILE
    if not path.exists():
        return None
    _inside(root, PROFILE_FILE, what="reference profile")
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_PROFILE_BYTES:
        raise UsageError(f"{path}: not a regular file of at most {MAX_PROFILE_BYTES} bytes; re-run edgesdk convert")
    return ReferenceProfile.parse_json_clear(path.read_bytes(), source=str(path))


def _first_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return " ".join(lines[:3]) if lines else type(exc).__name__


def _variant_entry(shipped: ShippedVariant, sealed: _SealedPayload) -> Variant:
    return Variant(
        id=shipped.id,
        format=shipped.format,
        precision=shipped.precision,
        runtime=shipped.runtime,
        payload=sealed.location.name,
        size=sealed.size,
        sha256=sealed.sha256,
        encrypted_size=sealed.location.length,
        encrypted_sha256=sealed.encrypted_sha256,
        inputs=shipped.inputs,
        outputs=shipped.outputs,
        accuracy=shipped.accuracy,
        quantization_method=shipped.quantization_method,
        load_rss_mb=shipped.measurements.peak_rss_mb,
        ladder_role="off" if shipped.validation != "numeric" else shipped.ladder_role,
        files=sealed.files,
    )
