"""``build_image``: put together an offline provisioning image for one device profile.

Image layout (a ``.tar.gz`` with one top folder ``edgesdk-image-<profile>/``)::

    install.sh            sets the device up with no network (see firmware_images/common)
    image.env             what install.sh needs to know: profile, CPU, Python, requirement, groups
    layout.tsv            directories with modes and owners
    image-manifest.json   ImageManifest: what is inside, with sha256 and size
    SHA256SUMS            the same hashes for `sha256sum -c` (install.sh checks them first)
    wheelhouse/           the edgesdk wheel and every dependency, for the device's platform
    overlay/              files for the device's root filesystem: unit, agent.toml, CA, publisher keys
    bundle/initial.edgepkg  the first model bundle, if one was given
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError, ImageError
from edgesdk.hashing import sha256_file
from edgesdk.image import wheelhouse
from edgesdk.image.agent_config import (
    CA_FILE,
    CONFIG_FILE,
    PROFILES_DIR,
    PUBLISHERS_DIR,
    TRUST_FILE,
    ProvisioningConfig,
    check_broker_url,
    render_agent_config,
)
from edgesdk.image.recipes import Recipe, common_dir, recipe_for
from edgesdk.image.unit_limits import DROP_IN, render_limits_drop_in
from edgesdk.schemas.image import ImageFile, ImageManifest
from edgesdk.schemas.profile import DeviceProfile

#: Extras a device may add to ``agent`` (device-side runtimes only, never converters).
DEVICE_EXTRAS = ("litert", "openvino")
INITIAL_BUNDLE = "bundle/initial.edgepkg"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageOptions:
    """Everything ``edgesdk image build`` was asked for."""

    profile: DeviceProfile
    broker: str
    out: Path
    bundle: Path | None = None
    ca: Path | None = None
    publisher_keys: list[Path] = field(default_factory=list)
    trust_document: Path | None = None
    groups: list[str] = field(default_factory=list)
    namespace: str = "edgesdk"
    api_port: int = 8470
    extras: list[str] = field(default_factory=list)
    family: str | None = None
    agent_wheel: Path | None = None


@dataclass(frozen=True)
class BuiltImage:
    path: Path
    manifest: ImageManifest
    seconds: float


def _check_file(path: Path | None, what: str) -> None:
    if path is not None and not path.is_file():
        raise ImageError(f"{what} {str(path)!r} does not exist or is not a file")


def _check_pem(path: Path, what: str) -> None:
    head = path.read_bytes()[:4096]
    if b"-----BEGIN " not in head:
        raise ImageError(f"{what} {str(path)!r} is not a PEM file (no '-----BEGIN' line)")


def _check_group(namespace: str, group: str) -> None:
    # The device builds topics from these; a bad one would only fail there, at run time.
    from edgesdk.protocol.topics import group_topic

    try:
        group_topic(namespace, group, "presence")
    except EdgeSDKError as exc:
        raise ImageError(str(exc)) from exc


def check_options(options: ImageOptions) -> tuple[Recipe, str]:
    """Validate everything before any slow step; returns the recipe and the device's Python."""
    python = wheelhouse.device_python(options.profile)
    recipe = recipe_for(options.profile, options.family)
    check_broker_url(options.broker)
    if options.ca is not None:
        _check_file(options.ca, "CA certificate")
        _check_pem(options.ca, "CA certificate")
        if options.broker.startswith("mqtt://"):
            raise ImageError(f"--ca was given but broker URL {options.broker!r} is plain mqtt://; use mqtts://")
    _check_file(options.bundle, "bundle")
    _check_file(options.agent_wheel, "agent wheel")
    for key in options.publisher_keys:
        _check_file(key, "publisher key")
        _check_pem(key, "publisher key")
    names = [key.name for key in options.publisher_keys]
    if len(set(names)) != len(names):
        raise ImageError(f"publisher key file names must differ (they share /etc/edgesdk/publishers): {names}")
    _check_file(options.trust_document, "trust document")
    if options.trust_document is not None:
        _check_trust_document(options.trust_document)
    if options.bundle is not None and not options.publisher_keys and options.trust_document is None:
        raise ImageError(
            "--bundle needs --trust-document or --publisher-key: the device must be able to verify the bundle's signature"
        )
    if options.agent_wheel is not None and not (
        options.agent_wheel.name.startswith("edgesdk-") and options.agent_wheel.suffix == ".whl"
    ):
        raise ImageError(f"agent wheel {str(options.agent_wheel)!r} is not an edgesdk-*.whl file")
    for group in options.groups:
        _check_group(options.namespace, group)
    unknown = [e for e in options.extras if e not in DEVICE_EXTRAS]
    if unknown:
        raise ImageError(f"extra {unknown[0]!r} is not a device runtime; choose from: {', '.join(DEVICE_EXTRAS)}")
    if not options.out.name.endswith((".tar.gz", ".tgz")):
        raise ImageError(f"output {str(options.out)!r} must end with .tar.gz")
    if not options.out.parent.is_dir():
        raise ImageError(f"output folder {str(options.out.parent)!r} does not exist")
    return recipe, python


def _check_trust_document(path: Path) -> None:
    """The shipped document must hold as the device will read it: its own root threshold signed
    it, and it has not expired (an expired one refuses every deployment from the first start)."""
    from edgesdk.trust import load_document, require_current, verify_self

    try:
        document = load_document(path)
        verify_self(document)
        require_current(document)
    except EdgeSDKError as exc:
        raise ImageError(f"trust document would be refused by the device: {exc}") from exc


def _check_bundle(options: ImageOptions) -> str | None:
    """Verify the initial bundle now, as the device will, so a wrong one fails here.

    Returns a line for the progress output (None when there is no bundle)."""
    if options.bundle is None:
        return None
    try:
        from edgesdk.bundle import verify_bundle
        from edgesdk.keys import load_publisher_public_key
    except ImportError:
        return "  (edgesdk.bundle is not available here: the bundle's signature is checked on the device only)"
    try:
        if options.trust_document is not None:  # the device then trusts the document's publishers only
            from edgesdk.trust import load_document, role_keys

            trusted = role_keys(load_document(options.trust_document).roles.publisher)
        else:
            trusted = [load_publisher_public_key(path) for path in options.publisher_keys]
        verified = verify_bundle(options.bundle, trusted_publishers=trusted, profile=options.profile)
    except EdgeSDKError as exc:
        raise ImageError(f"initial bundle would be refused by the device: {exc}") from exc
    model = verified.manifest.model
    return f"initial bundle verified: {model.name} {model.version} (release {model.release})"


def _write_overlay(options: ImageOptions, recipe: Recipe, stage: Path) -> None:
    overlay = stage / "overlay"
    shutil.copytree(common_dir() / "overlay", overlay)  # what every family gets
    shutil.copytree(recipe.overlay, overlay, dirs_exist_ok=True)
    config_dir = overlay / str(CONFIG_FILE.parent).lstrip("/")
    config_dir.mkdir(parents=True, exist_ok=True)
    settings = ProvisioningConfig(
        profile=options.profile.name,
        broker=options.broker,
        has_ca=options.ca is not None,
        publisher_key_names=[key.name for key in options.publisher_keys],
        has_trust_document=options.trust_document is not None,
        groups=list(options.groups),
        namespace=options.namespace,
        api_port=options.api_port,
    )
    (overlay / str(CONFIG_FILE).lstrip("/")).write_text(render_agent_config(settings), encoding="utf-8")
    limits = overlay / DROP_IN
    limits.parent.mkdir(parents=True, exist_ok=True)
    limits.write_text(render_limits_drop_in(options.profile, options.broker), encoding="utf-8")
    profiles = overlay / str(PROFILES_DIR).lstrip("/")
    profiles.mkdir(parents=True, exist_ok=True)
    # The resolved profile, standalone: the device knows a custom profile without its parents.
    resolved = options.profile.model_copy(update={"extends": None}).model_dump(mode="json")
    (profiles / f"{options.profile.name}.yaml").write_text(
        yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    if options.ca is not None:
        shutil.copyfile(options.ca, overlay / str(CA_FILE).lstrip("/"))
    if options.trust_document is not None:
        shutil.copyfile(options.trust_document, overlay / str(TRUST_FILE).lstrip("/"))
    if options.publisher_keys:
        publishers = overlay / str(PUBLISHERS_DIR).lstrip("/")
        publishers.mkdir(parents=True, exist_ok=True)
        for key in options.publisher_keys:
            shutil.copyfile(key, publishers / key.name)


def write_install_files(stage: Path, *, recipe: Recipe, profile: DeviceProfile, python: str, requirement: str) -> None:
    """``install.sh``, ``layout.tsv`` and ``image.env`` (what install.sh reads) into ``stage``."""
    shutil.copyfile(common_dir() / "install.sh", stage / "install.sh")
    (stage / "install.sh").chmod(0o755)
    shutil.copyfile(common_dir() / "layout.tsv", stage / "layout.tsv")
    env = {
        "EDGESDK_IMAGE_PROFILE": profile.name,
        # install.sh compares it with `uname -m` first: on another machine pip would only say
        # that some wheel has no match, never that the whole image is for another CPU.
        "EDGESDK_IMAGE_ARCH": profile.platform.arch,
        "EDGESDK_IMAGE_FAMILY": recipe.family,
        "EDGESDK_IMAGE_PYTHON": python,
        "EDGESDK_IMAGE_REQUIREMENT": requirement,
        "EDGESDK_IMAGE_GROUPS": " ".join(recipe.user_groups),
    }
    # Values are simple tokens (checked by their schemas); quote them anyway for the shell.
    text = "".join(f"{key}='{value}'\n" for key, value in env.items())
    (stage / "image.env").write_text(text, encoding="utf-8")


def _hash_files(stage: Path) -> list[ImageFile]:
    files = []
    for path in sorted(p for p in stage.rglob("*") if p.is_file()):
        relative = path.relative_to(stage).as_posix()
        files.append(ImageFile(path=relative, sha256=sha256_file(path), size=path.stat().st_size))
    return files


def _write_tar(stage: Path, out: Path, top: str) -> None:
    partial = out.with_name(out.name + ".partial")
    try:
        with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
            tar.add(stage, arcname=top)
        os.replace(partial, out)  # never leave a half-written image under the final name
    except BaseException:
        partial.unlink(missing_ok=True)  # also on Ctrl-C
        raise


def build_image(options: ImageOptions, progress: Progress = lambda _line: None) -> BuiltImage:
    """Build the image; ``progress`` receives one line per step."""
    started = time.monotonic()
    # Every check that can fail on the operator's input runs before the first line of output,
    # so a mistake is one error line and nothing else.
    recipe, python = check_options(options)
    bundle_line = _check_bundle(options)
    profile = options.profile
    progress(f"profile {profile.name}: {profile.platform.os}, {profile.platform.arch}, Python {python}")
    progress(f"firmware recipe: {recipe.family}")
    if bundle_line:
        progress(bundle_line)
    top = f"edgesdk-image-{profile.name}"
    with tempfile.TemporaryDirectory(prefix="edgesdk-image-") as tmp:
        stage = Path(tmp) / top
        wheel_dir = stage / "wheelhouse"
        wheel_dir.mkdir(parents=True)
        step_started = time.monotonic()
        if options.agent_wheel is not None:
            agent_wheel = wheel_dir / options.agent_wheel.name
            shutil.copyfile(options.agent_wheel, agent_wheel)
            progress(f"[1/4] using agent wheel {options.agent_wheel.name}")
        else:
            checkout = wheelhouse.find_checkout()
            if checkout is None:
                raise ImageError("edgesdk is not running from a source checkout; pass --agent-wheel FILE")
            progress(f"[1/4] building the edgesdk wheel from {checkout}")
            agent_wheel = wheelhouse.build_edgesdk_wheel(checkout, wheel_dir)
        progress(f"      {agent_wheel.name} ({time.monotonic() - step_started:.1f} s)")
        extras = ["agent", *options.extras]
        tags = profile.platform.wheel_platforms
        progress(
            f"[2/4] resolving edgesdk[{','.join(extras)}] for cp{python.replace('.', '')} {tags[0]} (+{len(tags) - 1} older tags)"
        )
        step_started = time.monotonic()
        wheels = wheelhouse.download_wheelhouse(agent_wheel, extras, profile, python, wheel_dir)
        size_mb = sum(w.stat().st_size for w in wheels) / 1e6
        progress(f"      {len(wheels)} wheels, {size_mb:.1f} MB ({time.monotonic() - step_started:.1f} s)")
        progress(f"[3/4] writing overlay, config and install.sh ({recipe.family})")
        version = agent_wheel.name.split("-")[1]
        requirement = f"edgesdk[{','.join(extras)}]=={version}"
        _write_overlay(options, recipe, stage)
        write_install_files(stage, recipe=recipe, profile=profile, python=python, requirement=requirement)
        if options.bundle is not None:
            (stage / "bundle").mkdir()
            shutil.copyfile(options.bundle, stage / INITIAL_BUNDLE)
        files = _hash_files(stage)
        (stage / "SHA256SUMS").write_text("".join(f"{f.sha256}  {f.path}\n" for f in files), encoding="utf-8")
        manifest = ImageManifest(
            created_at=datetime.now(timezone.utc),
            edgesdk_version=__version__,
            profile=profile.name,
            family=recipe.family,
            arch=profile.platform.arch,
            python=python,
            wheel_platforms=list(tags),
            requirement=requirement,
            wheels=[w.name for w in wheels],
            broker=options.broker,
            has_ca=options.ca is not None,
            initial_bundle=INITIAL_BUNDLE if options.bundle is not None else None,
            files=files,
        )
        (stage / "image-manifest.json").write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
        progress(f"[4/4] writing {options.out}")
        _write_tar(stage, options.out, top)
    seconds = time.monotonic() - started
    progress(f"image ready: {options.out} ({options.out.stat().st_size / 1e6:.1f} MB, {seconds:.0f} s)")
    return BuiltImage(path=options.out, manifest=manifest, seconds=seconds)
