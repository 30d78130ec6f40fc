"""``edgesdk demo``: the whole story, locally, on embedded defaults, in a few minutes.

Train the digits CNN, convert it with a precision ladder, package it signed and encrypted,
start mosquitto, the fleet service (``edgesdk fleet serve``, whose dashboard URL is printed) and
a few ``edge-agent`` processes, enroll them, deliver v1 over the air, run inference through the
local API, replay a heat wave, push v2 as a canary rollout, push a bad v3 that is rolled back
automatically (each rollout handed to the service over its REST API); then print a summary and
the paths of the conversion report and the fleet report. Ctrl-C stops every process it
started. See edgesdk/demo/.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from edgesdk.cli.output import console, print_json, print_table, profiles_dirs
from edgesdk.errors import EdgeSDKError, UsageError
from edgesdk.profiles import get_profile

if TYPE_CHECKING:
    from edgesdk.demo.story import DemoError, DemoOptions, DemoResult


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@click.command()
@click.option("--profile", "profile_name", default="rpi5-8gb", show_default=True, help="Device profile to target.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Work here and keep every artifact (keys, models, bundles, agent data, logs). Default: a temp dir.",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the temp work dir (its path is printed), with the fleet service's SQLite database and "
    "token. Every process (agents, broker, fleet service) is stopped at the end either way: the "
    "dashboard is live only while the demo runs.",
)
@click.option(
    "--agents", "agent_count", default=3, show_default=True, type=click.IntRange(2, 8), help="Agents to start."
)
@click.option(
    "--reports",
    "reports_dir",
    default="edgesdk-demo-reports",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the conversion report, the fleet report and summary.json go.",
)
@click.option("--formats", default="onnx", show_default=True, help="Formats to convert to (comma-separated).")
@click.option(
    "--model-cache",
    type=click.Path(file_okay=False, path_type=Path),
    help="Reuse the trained digits model from this directory (trained there the first time).",
)
@click.option(
    "--broker",
    type=click.Choice(["auto", "mosquitto", "embedded"]),
    default="auto",
    show_default=True,
    help="MQTT broker: mosquitto when installed, else the embedded pure-Python one (edgesdk[demo]).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (progress goes to stderr).")
@click.pass_context
def demo(
    ctx: click.Context,
    profile_name: str,
    workdir: Path | None,
    keep: bool,
    agent_count: int,
    reports_dir: Path,
    formats: str,
    model_cache: Path | None,
    broker: str,
    as_json: bool,
) -> None:
    """Run the local end-to-end demo (a few minutes)."""
    profile = get_profile(profile_name, profiles_dirs(ctx))
    _require_every_extra()
    from edgesdk.demo.story import DemoError, DemoOptions, result_json

    root = _work_dir(workdir)
    # With --json, stdout carries only the JSON; progress goes to stderr.
    out = Console(stderr=True, highlight=False) if as_json else console()
    options = DemoOptions(
        profile=profile,
        workdir=root,
        reports_dir=reports_dir.resolve(),
        agents=agent_count,
        formats=tuple(f.strip() for f in formats.split(",") if f.strip()),
        profiles_dirs=tuple(profiles_dirs(ctx)),
        model_cache=model_cache.resolve() if model_cache is not None else None,
        broker=broker,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    failed = False
    try:
        result = _run_story(out, options)
    except KeyboardInterrupt:
        # Raised by Ctrl-C (SIGINT) or SIGTERM; Demo.run() has stopped its processes by now.
        click.echo(
            f"error: interrupted after {time.monotonic() - began:.0f} s; every process the demo started is stopped",
            err=True,
        )
        sys.exit(130)  # click would turn Exit(130) into a return value of 0 outside standalone mode
    except DemoError as exc:
        # The work dir is what explains the failure (every log, the database): always kept.
        failed = True
        click.echo(failure_report(exc, root), err=True)
        sys.exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if workdir is None and not keep and not failed:
            shutil.rmtree(root, ignore_errors=True)
        elif workdir is None and not failed:
            out.print(f"work dir kept: {root}")
    summary = result_json(result)
    if as_json:
        print_json(summary)
        return
    _print_summary(summary, work_dir_kept=workdir is not None or keep)


def _require_every_extra() -> None:
    """One clear line (not a traceback deep in the story) when an extra the demo needs is missing."""
    try:
        import fastapi  # noqa: F401  (the fleet service the demo starts: the fleet-service extra)
        import matplotlib  # noqa: F401
        import sqlalchemy  # noqa: F401
        import torch  # noqa: F401

        import edgesdk.demo.story  # noqa: F401
    except ImportError as exc:
        raise EdgeSDKError(f"the demo needs every extra: pip install 'edgesdk[all]' ({exc.name} missing)") from exc


def _work_dir(workdir: Path | None) -> Path:
    """--workdir (new or empty, created), or a fresh temp dir."""
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="edgesdk-demo-"))
    if workdir.exists() and any(workdir.iterdir()):
        raise UsageError(f"--workdir {workdir} is not empty; give a new or empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir.resolve()


def _run_story(out: Console, options: DemoOptions) -> DemoResult:
    """The demo's story, its steps on a status line (the finished ones printed in green)."""
    from edgesdk.demo.story import Demo

    profile = options.profile
    out.print(
        f"[bold]edgesdk demo[/bold] — {profile.display_name} ({profile.name}), {options.agents} agents, in {options.workdir}"
    )
    with out.status("starting…") as status:

        def say(message: str) -> None:
            if message.startswith("[green]"):
                out.print(message)
            else:
                status.update(message)

        return Demo(options, say).run()


#: How much of the failed process's log goes under the error line.
FAILURE_LOG_LINES = 20


def failure_report(exc: DemoError, root: Path) -> str:
    """The one-line error of a failed step, the last lines of the failed process's log (when
    the error names one) and where the kept work dir is."""
    lines = [f"error: {exc}"]
    log_file = exc.log_file
    if log_file is not None:
        tail = _tail(log_file, FAILURE_LOG_LINES)
        if tail:
            lines.append(f"  last {len(tail)} lines of {log_file}:")
            lines.extend(f"    {line}" for line in tail)
        else:
            lines.append(f"  {log_file} is empty or missing")
    lines.append(f"work dir kept: {root}")
    return "\n".join(lines)


def _tail(path: Path, count: int) -> list[str]:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 64 * 1024))  # the end is enough; a log may be large
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-count:]


#: Governor states below the precision ceiling for heat (agent/governor/machine.py).
_STEPPED_DOWN = ("STEPPED_DOWN", "SAVE_STEPPED_DOWN")


def _serving_variant(device: dict[str, Any]) -> str:
    """The variant serving at the end, and why when heat holds it below the ceiling: the hot
    device's heat waves repeat, and a bare "onnx-int8" after the story's "back up to fp32"
    reads like a stale value."""
    variant = device["variant"] or "-"
    if device.get("governor") in _STEPPED_DOWN and device.get("temperature_c") is not None:
        return f"{variant} (stepped down at {device['temperature_c']:.0f} °C)"
    return variant


def _print_summary(summary: dict[str, Any], *, work_dir_kept: bool) -> None:
    print_table(
        f"edgesdk demo on {summary['profile']}: {summary['wall_s']:.0f} s",
        ["device", "serving", "variant", "precisions used", "requests", "failed", "accuracy", "p95 ms (client)"],
        [
            (
                d["device_id"],
                f"{d['version']} (r{d['release']})",
                _serving_variant(d),
                ", ".join(d["precisions_used"]),
                str(d["requests"]),
                str(d["failed_requests"]),
                f"{d['accuracy']:.1%}" if d["accuracy"] is not None else "-",
                f"{d['client_p95_ms']:.1f}" if d["client_p95_ms"] is not None else "-",
            )
            for d in summary["devices"]
        ],
    )
    print_table(
        "rollouts",
        ["push", "version", "canary → waves", "result", "reason"],
        [
            (r["name"], r["version"], " → ".join(", ".join(w) for w in r["waves"]), r["state"], r["reason"])
            for r in summary["rollouts"]
        ],
    )
    heat = summary.get("heat") or {}
    if "back_up_at_s" in heat:
        click.echo(
            f"heat wave:         {heat['device']} stepped down to {heat['lowest_precision']} at "
            f"{heat['stepped_down_at_s']:.0f} s and back up to {heat['top']} at {heat['back_up_at_s']:.0f} s "
            f"(its sensor trace repeats the wave every {heat.get('repeats_every_s', 0):.0f} s until the demo ends)"
        )
    second = summary.get("second_model") or {}
    if second.get("skipped"):
        click.echo(f"second model:      skipped ({second['skipped']})")
    elif second:
        answered = sum(d["second_model_requests"] for d in summary["devices"])
        failed = sum(d["second_model_failed_requests"] for d in summary["devices"])
        click.echo(
            f"second model:      {second['name']} ({second['variant']}) beside digits on every device: "
            f"{answered} requests, {failed} failed through the digits rollouts"
        )
    service = summary.get("service") or {}
    if service:
        # The service stopped with the demo; its database and token outlive it only in a kept work dir.
        kept = f"; its database and token are in {Path(service['token_file']).parent}" if work_dir_kept else ""
        click.echo(f"fleet dashboard:   {service['dashboard']} (stopped with the demo{kept})")
    click.echo(f"conversion report: {summary['reports']['conversion']}")
    click.echo(f"fleet report:      {summary['reports']['fleet']}")
