"""``edgesdk package CONVERT_DIR ...``: a convert output → one signed, encrypted bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgesdk.bundle import inspect_bundle
from edgesdk.cli.fleet_cmd import server_options
from edgesdk.cli.output import json_option, print_json, print_table, profiles_dirs
from edgesdk.errors import UsageError
from edgesdk.toolchain import package as package_bundle
from edgesdk.toolchain import parse_expiry


def _release_range(text: str) -> tuple[int, int]:
    """``5-7`` (or a single ``5``) → (5, 7)."""
    low, _, high = text.strip().partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise UsageError(f"--downgrade-from {text!r} is not a release range MIN-MAX (e.g. 5-7)") from None


@click.command("package")
@click.argument("convert_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", help="Model name (lower case, digits, . _ -; default: the report's model name).")
@click.option("--version", "version", required=True, help="Semantic version, e.g. 1.4.0.")
@click.option(
    "--release",
    type=click.IntRange(min=1),
    default=None,
    help="Monotonic release counter for anti-rollback (default: seconds since the Unix epoch, UTC).",
)
@click.option(
    "--publisher-key", required=True, type=click.Path(dir_okay=False, path_type=Path), help="publisher.key that signs."
)
@click.option(
    "--recipient",
    "recipients",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A device public key (device.pub) that may decrypt; repeatable.",
)
@click.option(
    "--recipient-group",
    "groups",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A group public key shared by several devices; repeatable.",
)
@click.option(
    "--recipients-from-registry",
    "registry",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also encrypt to every approved device of this enrollment registry (edgesdk fleet enroll).",
)
@click.option(
    "--recipients-from-server",
    "from_server",
    is_flag=True,
    help="Also encrypt to every device approved on the fleet service of --server/--token-file "
    "(or $EDGESDK_FLEET_SERVER/$EDGESDK_FLEET_TOKEN): its enrollment registry.",
)
@server_options
@click.option("--expires", default="never", show_default=True, help="90d, 12h, 4w, an ISO date, or never.")
@click.option(
    "--target", "targets", multiple=True, help="Device profile the bundle is for; repeatable (default: the report's)."
)
@click.option(
    "--downgrade-from",
    metavar="MIN-MAX",
    default=None,
    help="Sign permission to install this (older) release on devices whose rollback floor is in MIN-MAX.",
)
@click.option(
    "--downgrade-expires",
    default="7d",
    show_default=True,
    help="When the downgrade permission ends: 12h, 7d, an ISO date (never is refused).",
)
@click.option("--allow-downgrade", is_flag=True, hidden=True, help="Removed: use --downgrade-from.")
@click.option(
    "--allow-unvalidated",
    is_flag=True,
    help="Also package variants that could not be run on this host (Core ML on Linux); they ship off the ladder.",
)
@click.option("--publisher-name", default="edgesdk-publisher", show_default=True, help="Shown to operators.")
@click.option("--description", default="", help="Free text stored in the manifest.")
@click.option(
    "--pipeline",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A pipeline file (YAML): the pre/post-processing of /predict, signed into the bundle.",
)
@click.option(
    "--labels",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Class names, one a line by index, for the pipeline's top-k (needs --pipeline).",
)
@click.option(
    "--tokenizer",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A text pipeline's tokenizer.json (Hugging Face tokenizers), signed into the bundle (needs --pipeline).",
)
@click.option(
    "--vocabulary",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A ctc post step's tokens, one a line by index (needs --pipeline).",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="FILE.edgepkg to write.")
@json_option
@click.pass_context
def package(
    ctx: click.Context,
    convert_dir: Path,
    name: str | None,
    version: str,
    release: int | None,
    publisher_key: Path,
    recipients: tuple[Path, ...],
    groups: tuple[Path, ...],
    registry: Path | None,
    from_server: bool,
    server: str | None,
    token_file: Path | None,
    expires: str,
    targets: tuple[str, ...],
    downgrade_from: str | None,
    downgrade_expires: str,
    allow_downgrade: bool,
    allow_unvalidated: bool,
    publisher_name: str,
    description: str,
    pipeline: Path | None,
    labels: Path | None,
    tokenizer: Path | None,
    vocabulary: Path | None,
    out: Path,
    as_json: bool,
) -> None:
    """Sign and encrypt the variants of CONVERT_DIR (an `edgesdk convert` output) into one bundle."""
    if allow_downgrade:
        raise UsageError(
            "--allow-downgrade signed an unbounded downgrade and is gone: use --downgrade-from MIN-MAX "
            "(the device floors it may replace) and --downgrade-expires"
        )
    if pipeline is not None:
        _same_pipeline_as_validated(convert_dir, pipeline, labels, tokenizer, vocabulary)
    device_recipients: list[Any] = list(recipients)
    if from_server:
        device_recipients += _approved_on_service(server, token_file)
    elif server is not None:
        raise UsageError("--server is only read with --recipients-from-server here")
    path = package_bundle(
        convert_dir,
        name=name,
        version=version,
        release=release,
        publisher_key=publisher_key,
        recipients=device_recipients,
        group_recipients=groups,
        registry=registry,
        targets=targets,
        expires=parse_expiry(expires, option="--expires"),
        downgrade_from=_release_range(downgrade_from) if downgrade_from else None,
        downgrade_expires=downgrade_expires,
        out=out,
        publisher_name=publisher_name,
        description=description,
        profiles_dirs=profiles_dirs(ctx),
        allow_unvalidated=allow_unvalidated,
        pipeline=pipeline,
        labels=labels,
        tokenizer=tokenizer,
        vocabulary=vocabulary,
    )
    summary = _bundle_summary(path)
    if as_json:
        print_json(summary)
        return
    print_table(f"packaged {path}", ["field", "value"], [(k, v) for k, v in summary.items()])


def _bundle_summary(path: Path) -> dict[str, Any]:
    """What was packaged, read back from the bundle's manifest: the table's rows, or --json."""
    manifest = inspect_bundle(path).manifest
    return {
        "bundle": str(path),
        "size": path.stat().st_size,
        "name": manifest.model.name,
        "version": manifest.model.version,
        "release": manifest.model.release,
        "targets": manifest.targets,
        "expires": manifest.expires.isoformat() if manifest.expires else None,
        "variants": [v.id for v in manifest.variants],
        "pipeline": _pipeline_summary(manifest.pipeline),
        "recipients": [s.recipient for s in manifest.encryption.key_slots] if manifest.encryption else [],
    }


def _pipeline_summary(pipeline: Any) -> str | None:
    """One line: what /predict does with this bundle (None without a pipeline)."""
    if pipeline is None:
        return None
    post = pipeline.post
    labels = f", {len(post.labels)} labels" if post.labels else ""
    return f"{pipeline.input} -> {post.kind} ({post.activation}, top {post.top_k}{labels})"


def _same_pipeline_as_validated(
    convert_dir: Path, pipeline: Path, labels: Path | None, tokenizer: Path | None, vocabulary: Path | None
) -> None:
    """A convert output gated end to end (convert --pipeline --reference) signs only the pipeline
    it validated: another mean/std or labels file would ship answers nobody checked."""
    from edgesdk.converters.end_to_end import pipeline_sha256
    from edgesdk.schemas.pipeline import load_pipeline
    from edgesdk.schemas.report import ConversionReport

    try:
        report = ConversionReport.model_validate_json((convert_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # package_bundle says what is wrong with the convert dir, in its own words
    checked = report.end_to_end
    if checked is None:
        return
    signed = load_pipeline(pipeline, labels, tokenizer, vocabulary)  # the tokenizer and vocabulary are in it too
    if pipeline_sha256(signed) != checked.pipeline_sha256:
        raise UsageError(
            f"--pipeline {pipeline} (with --labels {labels}) is not the pipeline {convert_dir} was validated with end "
            f"to end (against {checked.reference}); package that one, or convert again with this one"
        )


def _approved_on_service(server: str | None, token_file: Path | None) -> list[Any]:
    """The keys of every device approved on the fleet service (its one enrollment registry)."""
    from edgesdk.fleet.enrollment import recipients_from_service
    from edgesdk.fleet.service_client import client_from

    client = client_from(server, token_file)
    if client is None:
        raise UsageError("--recipients-from-server needs --server URL (or $EDGESDK_FLEET_SERVER) and --token-file")
    return list(recipients_from_service(client.enrollment(), client.server))
