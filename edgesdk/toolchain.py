"""The host toolchain as functions: convert a model, package a bundle, verify it, load a profile.

These are what ``edgesdk convert``, ``edgesdk package`` and ``edgesdk bundle verify`` run; the
commands only parse their options and print. Exported lazily from :mod:`edgesdk`::

    import edgesdk

    report = edgesdk.convert("digits.onnx", "rpi5-8gb", out="convert/", calibration="cal.npz")
    bundle = edgesdk.package(report, version="1.0.0", publisher_key="keys/publisher.key",
                             recipients=["device.pub"], out="digits.edgepkg")
    edgesdk.verify_bundle(bundle, trusted_publishers="keys/publisher.pub", device_key="device.key")

Heavy modules (converters, torch, the runtimes) are imported inside the functions, so importing
this module costs no more than the profiles and schemas it names.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgesdk.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    from edgesdk.bundle.verify import VerifiedBundle
    from edgesdk.schemas.manifest import BundleManifest, DowngradePermission
    from edgesdk.schemas.profile import DeviceProfile
    from edgesdk.schemas.report import ConversionReport

__all__ = [
    "BundleVerification",
    "DecryptedVariant",
    "convert",
    "load_profile",
    "package",
    "parse_expiry",
    "verify_bundle",
]

_T = TypeVar("_T")

#: ``progress(message, done, total)``, called as each conversion step starts: ``total`` is the
#: number of stages (read, reference, build, timing, report), the same on every call, and
#: ``done`` the stages finished (never going back); the message names the step, e.g.
#: ``"onnx-int8 (static-qdq-percentile): converting, 3 of 7"`` (``edgesdk.converters.pipeline.Stage``).
ProgressCallback = Callable[[str, int, int], None]

# Which directory each report returned by convert() was written to, by identity: a report
# is a frozen value (two conversions can give equal ones), and a private attribute on the
# schema would change its equality. Entries go when their report is garbage collected.
_report_dirs: dict[int, tuple[weakref.ref[Any], Path]] = {}


def _remember_dir(report: ConversionReport, directory: Path) -> None:
    ident = id(report)
    _report_dirs[ident] = (weakref.ref(report, lambda _: _report_dirs.pop(ident, None)), directory)


def _dir_of(report: ConversionReport) -> Path:
    entry = _report_dirs.get(id(report))
    if entry is None or entry[0]() is not report:
        raise UsageError(
            f"report of {report.model_name!r} was not returned by edgesdk.convert() in this process, so its "
            "output directory is unknown; pass the convert output directory instead"
        )
    return entry[1]


def _as_list(value: _T | Iterable[_T] | None, single: tuple[type, ...]) -> list[_T]:
    """One item or many: a str or Path is one item, never its characters."""
    if value is None:
        return []
    if isinstance(value, (str, Path, *single)):
        return [value]  # type: ignore[list-item]
    return list(value)  # type: ignore[arg-type]


def _names(value: Collection[str] | str | None) -> list[str] | None:
    """``"onnx,tflite"`` or ``["onnx", "tflite"]`` → a list (None when empty)."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = [str(p).strip() for p in parts if str(p).strip()]
    return names or None


# -- profiles ---------------------------------------------------------------------------------


def load_profile(
    name_or_path: str | Path | DeviceProfile, *, profiles_dirs: Iterable[str | Path] = ()
) -> DeviceProfile:
    """A device profile by name (built in, ``profiles_dirs`` or ``EDGESDK_PROFILE_PATH``), or from a YAML file.

    A :class:`~pathlib.Path`, or a string ending in ``.yaml``/``.yml``, is read as a profile
    file (its ``extends`` resolved against the built-in profiles); a DeviceProfile is returned
    as is. An unknown name raises :class:`~edgesdk.errors.ProfileError` listing the known ones."""
    from edgesdk.profiles import get_profile, load_profile_file
    from edgesdk.schemas.profile import DeviceProfile

    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    if isinstance(name_or_path, Path) or str(name_or_path).endswith((".yaml", ".yml")):
        return load_profile_file(name_or_path)
    return get_profile(str(name_or_path), profiles_dirs)


# -- convert ----------------------------------------------------------------------------------


def convert(
    model: str | Path | Any,
    profile: str | Path | DeviceProfile,
    *,
    out: str | Path,
    calibration: str | Path | Mapping[str, np.ndarray] | None = None,
    validation: str | Path | Mapping[str, np.ndarray] | None = None,
    metric: str | Mapping[str, Any] | Sequence[str] = "auto",
    gate: float | None = None,
    formats: Collection[str] | str | None = None,
    precisions: Collection[str] | str | None = None,
    name: str | None = None,
    output_names: Sequence[str] | str | None = None,
    example: Mapping[str, np.ndarray] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    int8_methods: Collection[str] | None = None,
    profiles_dirs: Iterable[str | Path] = (),
    progress: ProgressCallback | None = None,
    batch_axes: Mapping[str, int | str] | None = None,
    as_is: bool = False,
    state_pairs: Mapping[str, str] | None = None,
    end_to_end: Any = None,
) -> ConversionReport:
    """Convert ``model`` for a device profile into validated artifacts under ``out``.

    ``model``: an ``.onnx``, ``.tflite`` or OpenVINO IR ``.xml`` path (its ``.bin`` beside it),
    a ``"module:factory"`` string naming a function that returns a ``torch.nn.Module``, or the
    module itself. ``as_is=True`` ships a prebuilt file as it is (one variant, at the
    precision found in it), validated in its runtime. ``profile``: a name, a profile file or a
    DeviceProfile. ``out`` must not exist or be empty; it appears only when the conversion
    succeeds (``report.json``, ``report.html``, ``golden.npz``, ``artifacts/<variant>/``).

    ``calibration``/``validation``: ``.npz`` files or mappings of arrays keyed by input name
    (``labels`` for top-1 accuracy). ``metric`` and ``gate`` decide which variants ship: every
    output is judged by its own metric (``auto`` chooses one per output from its name and shape),
    or ``metric`` names them: a kind for every output (``top1``, ``cosine``, ``abs``, ``iou``,
    ``ctc``, ``max_abs``), a mapping ``{"landmarks": "abs:1.5", "text": "ctc:blank=0"}``, a list
    of ``"OUTPUT=KIND[:THRESHOLD]"``, or an :class:`edgesdk.converters.output_metrics.OutputMetric`
    per output (a ``ctc`` one may carry a ``decode`` hook: one sample's output → its text). ``formats``, ``precisions``, ``int8_methods``
    narrow the plan (lists or comma-separated strings). ``example`` (input name → one batch)
    and ``dynamic_axes`` (input name → {axis: label}) describe a PyTorch model's inputs.
    The data keeps the model's own layout: ``batch_axes`` (tensor name → axis, or ``"none"``
    for a constant) says where the samples are when the model's dimension names do not.
    ``state_pairs`` (state input → next-state output; found by name when not given) make a
    stateful model's streams validate step by step with the state fed back. ``end_to_end``
    (:func:`edgesdk.converters.end_to_end.prepare_task_check`) also gates every variant on the
    user's raw files through the bundle's pipeline against their own results.

    Returns the :class:`~edgesdk.schemas.report.ConversionReport`, which :func:`package`
    accepts directly. Raises :class:`~edgesdk.errors.ConversionError` (or a subclass,
    :class:`~edgesdk.errors.BudgetError`) when no variant can ship."""
    # The profile first: an unknown name is one clear error before any heavy import.
    device_profile = load_profile(profile, profiles_dirs=profiles_dirs)
    from edgesdk.converters import convert as run_pipeline

    destination = Path(out)
    report = run_pipeline(
        str(model) if isinstance(model, Path) else model,
        device_profile,
        destination,
        calibration=calibration,
        validation=validation,
        metric=metric,
        gate=gate,
        formats=_names(formats),
        precisions=_names(precisions),
        name=name,
        output_names=_names(output_names),
        example=example,
        dynamic_axes=dynamic_axes,
        int8_methods=_names(int8_methods),
        progress=progress,
        batch_axes=batch_axes,
        as_is=as_is,
        state_pairs=state_pairs,
        end_to_end=end_to_end,
    )
    _remember_dir(report, destination)
    return report


# -- package ----------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+)([hdw])$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_expiry(text: str, *, option: str = "expires") -> timedelta | datetime | None:
    """``90d``/``12h``/``4w`` (from now), an ISO date or date-time (UTC if no zone), or ``never``.

    ``option`` names the setting in error messages (the CLI passes ``--expires``)."""
    value = text.strip().lower()
    if value in {"never", "none"}:
        return None
    match = _DURATION.match(value)
    if match:
        amount = int(match.group(1))
        if amount == 0:
            raise UsageError(f"{option} {text!r}: a bundle that expires at once cannot be installed")
        return timedelta(**{_UNITS[match.group(2)]: amount})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"{option} {text!r} is not a duration (90d, 12h, 4w), an ISO date (2027-01-31) or 'never'"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _downgrade_permission(
    downgrade_from: tuple[int, int] | None, expires: str | timedelta | datetime
) -> DowngradePermission | None:
    """The signed downgrade permission, or None; an unbounded one cannot be made."""
    from edgesdk.schemas.manifest import DowngradePermission

    if downgrade_from is None:
        return None
    moment = parse_expiry(expires, option="--downgrade-expires") if isinstance(expires, str) else expires
    if moment is None:
        raise UsageError("--downgrade-expires never: a downgrade permission must expire (e.g. 7d)")
    if isinstance(moment, timedelta):
        moment = datetime.now(timezone.utc).replace(microsecond=0) + moment
    low, high = downgrade_from
    return DowngradePermission.parse_obj_clear(
        {"from_releases": [low, high], "expires_at": moment}, source="--downgrade-from"
    )


def package(
    report_or_dir: ConversionReport | str | Path,
    *,
    out: str | Path,
    version: str,
    publisher_key: str | Path | Ed25519PrivateKey,
    recipients: str | Path | X25519PublicKey | Iterable[str | Path | X25519PublicKey] = (),
    group_recipients: str | Path | X25519PublicKey | Iterable[str | Path | X25519PublicKey] = (),
    registry: str | Path | None = None,
    name: str | None = None,
    release: int | None = None,
    expires: str | timedelta | datetime | None = None,
    targets: Iterable[str | DeviceProfile] | None = None,
    downgrade_from: tuple[int, int] | None = None,
    downgrade_expires: str | timedelta | datetime = "7d",
    publisher_name: str = "edgesdk-publisher",
    description: str = "",
    profiles_dirs: Iterable[str | Path] = (),
    allow_unvalidated: bool = False,
    pipeline: str | Path | None = None,
    labels: str | Path | None = None,
    tokenizer: str | Path | None = None,
    vocabulary: str | Path | None = None,
) -> Path:
    """Sign and encrypt the variants of a conversion into one bundle file; returns its path.

    ``report_or_dir``: a report returned by :func:`convert`, or a convert output directory.
    ``recipients``: device public keys (``device.pub`` paths or keys) that may decrypt;
    ``group_recipients``: group keys shared by several devices; ``registry``: also every
    approved device of an enrollment registry (``edgesdk fleet enroll``). At least one
    recipient is needed. ``name`` defaults to the report's model name; ``release`` (the
    anti-rollback counter) to seconds since the epoch; ``expires`` is ``"90d"``, an ISO date,
    a datetime, a timedelta from now, or None/``"never"``; ``targets`` default to the
    report's profile. ``downgrade_from`` ``(min, max)`` signs permission to install this older
    release on a device whose rollback floor lies in that range, until ``downgrade_expires``
    (a duration from now or a moment; default 7 days). ``allow_unvalidated`` admits variants
    that could not be run where they were converted (Core ML on Linux), marked off the ladder.
    ``pipeline`` (a YAML file) and ``labels`` (one class a line) sign the pre/post-processing
    of ``POST /v1/models/{name}/predict`` into the manifest (docs/bundle-format.md, "Pipeline"),
    with a text pipeline's ``tokenizer`` (a tokenizer.json) and a CTC ``vocabulary`` (one token a line)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    from edgesdk.bundle import package_bundle

    directory = Path(report_or_dir) if isinstance(report_or_dir, (str, Path)) else _dir_of(report_or_dir)
    device_keys: list[Any] = _as_list(recipients, (X25519PublicKey,))
    if registry is not None:
        from edgesdk.fleet.enrollment import recipients_from_registry

        device_keys += recipients_from_registry(registry)
    group_keys: list[Any] = _as_list(group_recipients, (X25519PublicKey,))
    if not device_keys and not group_keys:
        raise UsageError(
            "no recipients: pass --recipient DEVICE.pub and/or --recipient-group GROUP.pub "
            "(recipients= / group_recipients= from Python)"
        )
    # Each target is checked up front: an unknown profile is one line listing the known ones.
    target_names = [load_profile(t, profiles_dirs=profiles_dirs).name for t in targets or ()]
    if name is None:
        name = _bundle_name_of(_report_in(directory))
    return package_bundle(
        directory,
        name=name,
        version=version,
        release=release,
        publisher_key=publisher_key,
        recipients=device_keys,
        group_recipients=group_keys,
        targets=target_names or None,
        expires=parse_expiry(expires) if isinstance(expires, str) else expires,
        downgrade=_downgrade_permission(downgrade_from, downgrade_expires),
        out=out,
        publisher_name=publisher_name,
        description=description,
        allow_unvalidated=allow_unvalidated,
        pipeline=_pipeline_of(pipeline, labels, tokenizer, vocabulary),
    )


def _pipeline_of(
    pipeline: str | Path | None,
    labels: str | Path | None,
    tokenizer: str | Path | None = None,
    vocabulary: str | Path | None = None,
) -> Any:
    """The validated pipeline of a pipeline file (+ labels, tokenizer, vocabulary), or None without one."""
    if pipeline is None:
        for option, given in (("--labels", labels), ("--tokenizer", tokenizer), ("--vocabulary", vocabulary)):
            if given is not None:
                raise UsageError(f"{option} goes with --pipeline (the pipeline file that uses it)")
        return None
    from edgesdk.schemas.pipeline import load_pipeline

    return load_pipeline(pipeline, labels, tokenizer, vocabulary)


def _bundle_name_of(report: ConversionReport) -> str:
    """The report's model name as the bundle's; one that a bundle cannot carry (a file stem such
    as ``MobileNetV2``) asks for an explicit name instead of failing on the manifest's pattern."""
    from edgesdk.schemas.manifest import ModelInfo

    # The manifest's own rule, read from its schema rather than written out a second time.
    pattern = ModelInfo.model_json_schema()["properties"]["name"]["pattern"]
    if not re.match(pattern, report.model_name):
        suggestion = re.sub(r"[^a-z0-9._-]+", "-", report.model_name.lower()).strip("-._") or "model"
        raise UsageError(
            f"the report's model name {report.model_name!r} is not a bundle name (lower case, digits, . _ -): "
            f"pass --name (name= from Python), e.g. --name {suggestion}"
        )
    return report.model_name


def _report_in(directory: Path) -> ConversionReport:
    from edgesdk.schemas.report import ConversionReport

    path = directory / "report.json"
    if not path.is_file():
        raise UsageError(f"{directory} is not a convert output dir (no report.json)")
    return ConversionReport.parse_json_clear(path.read_bytes(), source=str(path))


# -- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecryptedVariant:
    """A variant that decrypted in memory with the device key and matched its signed hashes."""

    files: int
    size: int


@dataclass(frozen=True)
class BundleVerification:
    """What :func:`verify_bundle` checked: the verified bundle, the checks, what decrypted."""

    bundle: VerifiedBundle
    checks: tuple[str, ...]
    decrypted: dict[str, DecryptedVariant] = field(default_factory=dict)
    golden_arrays: int | None = None

    @property
    def manifest(self) -> BundleManifest:
        return self.bundle.manifest

    @property
    def path(self) -> Path:
        return self.bundle.path

    @property
    def sha256(self) -> str:
        return self.bundle.sha256


def verify_bundle(
    path: str | Path,
    *,
    trusted_publishers: str | Path | Ed25519PublicKey | Iterable[str | Path | Ed25519PublicKey],
    device_key: str | Path | X25519PrivateKey | None = None,
    profile: str | Path | DeviceProfile | None = None,
    installed_release: int | None = None,
    now: datetime | None = None,
    profiles_dirs: Iterable[str | Path] = (),
    rollback_floor: int | None = None,
) -> BundleVerification:
    """Check a bundle file as a device would; nothing is written.

    Always: the signature by one of ``trusted_publishers`` (``publisher.pub`` paths or keys),
    the payload hashes and the expiry (against ``now``, default the clock). With ``profile``:
    the bundle must target it. With ``installed_release`` and/or ``rollback_floor``: anti-rollback. With ``device_key``
    (a ``device.key`` path or key): every variant and the golden set are also decrypted in
    memory and checked against their signed plaintext hashes.

    Raises a :class:`~edgesdk.errors.BundleError` subclass naming the first check that failed.
    The result's ``bundle`` is the :class:`~edgesdk.bundle.VerifiedBundle` that
    ``edgesdk.bundle.decrypt_variant`` takes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from edgesdk.bundle import decrypt_golden, decrypt_variant
    from edgesdk.bundle import verify_bundle as verify_file
    from edgesdk.keys import load_device_private_key

    device_profile = load_profile(profile, profiles_dirs=profiles_dirs) if profile is not None else None
    key = (
        device_key
        if isinstance(device_key, X25519PrivateKey) or device_key is None
        else load_device_private_key(device_key)
    )
    verified = verify_file(
        path,
        trusted_publishers=_as_list(trusted_publishers, (Ed25519PublicKey,)),
        profile=device_profile,
        installed_release=installed_release,
        now=now,
        rollback_floor=rollback_floor,
    )
    decrypted: dict[str, DecryptedVariant] = {}
    golden_arrays = None
    if key is not None:
        for variant in verified.manifest.variants:
            files = decrypt_variant(verified, variant.id, key)
            decrypted[variant.id] = DecryptedVariant(len(files), sum(len(c) for c in files.values()))
            del files  # one variant's plaintext in memory at a time
        golden = decrypt_golden(verified, key)
        golden_arrays = None if golden is None else len(golden)
    checks = ["signature", "payload hashes", "expiry"]
    checks += ["target profile"] if device_profile is not None else []
    checks += ["anti-rollback"] if installed_release is not None or rollback_floor is not None else []
    checks += ["decryption + plaintext hashes"] if key is not None else []
    return BundleVerification(verified, tuple(checks), decrypted, golden_arrays)
