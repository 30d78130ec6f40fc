"""``edgesdk fleet push|status|abort|rollback``: staged OTA rollouts from the operator's shell.

``push`` blocks while the rollout runs (it also serves the bundle's chunks to the devices), with
a progress bar per wave; Ctrl-C leaves the deployment IN_PROGRESS in the database, and
``push --deployment-id ID`` with the same id resumes it. ``status`` reads the database only;
``abort`` and ``rollback`` also tell the devices (signed cancel/rollback messages).

Every message devices get is issued when it is sent: addressed to those devices, with the next
sequence number of the operator key and valid for ``--expires`` (devices refuse it after that;
see docs/ota.md). Each wave of a push gets its own.

With ``--server URL`` (or ``$EDGESDK_FLEET_SERVER``) the same commands go to the fleet
service's REST API instead: ``push`` uploads the bundle and creates the deployment there, then
follows it (Ctrl-C stops following, the service keeps driving it); ``status``, ``abort`` and
``rollback`` read and act on the service's deployments. See docs/fleet-service.md.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.fleet_cmd import broker_options, require_broker, server_options, service_client
from edgesdk.cli.fleet_models import (
    check_bundle_model,
    check_deployment_model,
    keep_model,
    latest_of_model,
    model_of,
    model_option,
    per_model_rows,
)
from edgesdk.cli.output import console, json_option, print_json, print_table
from edgesdk.cli.rollout_options import EXPIRES_HELP, RolloutArgs, positive_duration, rollout_options
from edgesdk.errors import UpdateError, UsageError

OPERATOR_KEY_ENV = "EDGESDK_OPERATOR_KEY"

_db_option = click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Deployment database (default $EDGESDK_FLEET_DB or ~/.local/share/edgesdk/fleet.sqlite3).",
)
_key_option = click.option(
    "--operator-key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Operator's Ed25519 private key that signs deployments (or ${OPERATOR_KEY_ENV}).",
)


def _store(db_path: Path | None) -> Any:
    """The deployment store in the SQLite file ``--db`` (the fleet service's store code)."""
    from edgesdk.fleet.deployments import default_db_path

    try:
        from edgesdk.fleet.service.operator_db import open_rollout_store
    except ImportError as exc:
        raise UsageError(f"the deployment database needs SQLAlchemy: pip install 'edgesdk[fleet]' ({exc})") from exc
    return open_rollout_store(db_path or default_db_path())


def _operator_key(key_path: Path | None) -> Any:
    from edgesdk.keys import load_publisher_private_key

    path = key_path or (Path(os.environ[OPERATOR_KEY_ENV]) if os.environ.get(OPERATOR_KEY_ENV) else None)
    if path is None:
        raise UsageError(
            f"no operator key: pass --operator-key FILE or set {OPERATOR_KEY_ENV} (edgesdk keys publisher makes one)"
        )
    return load_publisher_private_key(path)


def _controller(store: Any, params: dict[str, Any], key: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Connect with the fleet group's connection flags (``broker_options``) and start a controller."""
    from edgesdk.cli.fleet_cmd import client_options_from
    from edgesdk.errors import LinkError
    from edgesdk.fleet.rollout import RolloutController
    from edgesdk.mqtt.client import MqttClient

    client = MqttClient(client_options_from(params, f"edgesdk-fleet-rollout-{uuid.uuid4().hex[:8]}"))
    client.start()
    timeout = float(params.get("connect_timeout") or 5.0)
    if not client.wait_connected(timeout):
        client.stop(graceful=False)
        raise LinkError(
            f"cannot connect to broker {params['broker']}: {client.stats.last_error or f'no answer in {timeout:g} s'}"
        )
    return RolloutController(store, client, params["namespace"], key, **kwargs).start(), client


class _WaveBars:
    """A rich progress bar per wave, fed by the controller's progress events."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console(),
        )
        self.tasks: dict[int, Any] = {}
        self.messages: list[str] = []

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "wave_started":
            name = "canary" if info["wave"] == 0 and info["waves"] > 1 else f"wave {info['wave']}"
            self.tasks[info["wave"]] = self.progress.add_task(name, total=info["devices"], detail="")
        elif event == "wave_progress" and info["wave"] in self.tasks:
            states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(info["states"].items()))
            self.progress.update(self.tasks[info["wave"]], completed=info["done"], detail=states)
        elif event == "waiting":  # --start-at or --window: say why nothing moves yet
            self.progress.console.print(info["reason"])
        elif event == "aborted":
            self.messages.append(f"aborted in wave {info['wave']}: {info['reason']}")
        elif event == "refused":  # at once, above the bars: the operator sees why before the abort
            self.progress.console.print(f"refused by {info['device_id']}: {info['reason']}")
        elif event == "refusal_ignored":
            self.progress.console.print(
                f"warning: {info['device_id']} refused a command this push did not issue to it "
                f"(digest {info['command_sha256'][:12]}, not counted): {info['reason']}"
            )


@click.command("push")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@broker_options(required=False)
@server_options
@rollout_options
@model_option
@_key_option
@_db_option
@json_option
def push(
    bundle: Path,
    rollout: RolloutArgs,
    model_name: str | None,
    key_path: Path | None,
    db_path: Path | None,
    as_json: bool,
    **params: Any,
) -> None:
    """Roll BUNDLE out in waves: canary first, abort and roll back at the failure threshold.

    The bundle's model is the one updated on each device; the device's other models keep serving."""
    check_bundle_model(bundle, model_name)
    deployment_id = rollout.deployment_id
    urls = rollout.urls()  # a bad URL fails before anything is opened
    client = service_client(params)
    if client is not None:
        body = rollout.api_body()
        uploaded = client.upload(bundle)
        created = client.create({**body, "bundle_id": uploaded["id"]})
        _follow(client, created["deployment_id"], as_json)
        return
    if rollout.dynamic:
        raise UsageError("--target-filter and --where need --server: tags and filters live in the fleet service")
    require_broker(params)
    store = _store(db_path)
    resuming = _resumes_unfinished(store, deployment_id)
    if not resuming:
        rollout.check_targets()
        if not bundle.is_file():
            raise UsageError(f"bundle file {str(bundle)!r} not found")
        plan = rollout.plan()
        health = rollout.health(plan)
    key = _operator_key(key_path)
    bars = _WaveBars()
    ctl, client = _controller(store, params, key, on_progress=bars if not as_json else None)
    try:
        if not resuming:
            deployment_id = _create_deployment(ctl, bundle, rollout, plan, health, deployment_id, urls)
        if deployment_id is None:  # pragma: no cover - set above
            raise UsageError("no deployment id")
        state = _run_deployment(ctl, deployment_id, None if as_json else bars, resuming)
    finally:
        client.stop()
    _end_push(store, deployment_id, state, bars, as_json)


def _resumes_unfinished(store: Any, deployment_id: str | None) -> bool:
    """Whether --deployment-id names a deployment in the database (then push resumes it);
    UsageError when that one has already ended."""
    from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES

    if deployment_id is None:
        return False
    try:
        existing = store.get(deployment_id)
    except UsageError:
        return False
    if existing is None:
        return False
    if existing.state in FINISHED_ROLLOUT_STATES:
        raise UsageError(f"deployment {deployment_id!r} already ended {existing.state}; pick a new id")
    return True


def _create_deployment(
    ctl: Any,
    bundle: Path,
    rollout: RolloutArgs,
    plan: Any,
    health: Any,
    deployment_id: str | None,
    urls: Any,
) -> str:
    """Records a new deployment of ``bundle`` to --devices (or the group's devices); its id."""
    targets = rollout.device_list()
    if targets is None:
        targets = ctl.devices_in_group(rollout.group or "")
    message = ctl.create(
        bundle,
        targets,
        plan,
        deployment_id=deployment_id,
        artifact_urls=urls,
        mqtt_fallback=rollout.mqtt_fallback,
        chunk_size=rollout.chunk_size,
        health=health,
    )
    return message.deployment_id


def _run_deployment(ctl: Any, deployment_id: str, bars: _WaveBars | None, resuming: bool) -> str:
    """Runs the deployment to its end state; with bars (not --json), Ctrl-C stops it, resumable."""
    from edgesdk.fleet.rollout import STOPPED

    if bars is None:
        return ctl.run(deployment_id)
    console().print(f"deployment {deployment_id}{' (resumed)' if resuming else ''}")
    with bars.progress:
        try:
            return ctl.run(deployment_id)
        except KeyboardInterrupt:
            ctl.stop()
            return STOPPED


def _end_push(store: Any, deployment_id: str, state: str, bars: _WaveBars, as_json: bool) -> None:
    """Prints the deployment's summary; UpdateError (non-zero exit) unless it succeeded."""
    from edgesdk.fleet.deployments import SUCCEEDED
    from edgesdk.fleet.rollout import STOPPED

    summary = store.summary(deployment_id)
    if as_json:
        print_json(summary)
    else:
        for line in bars.messages:
            console().print(line)
        _print_summary(summary)
    if state == STOPPED:
        raise UpdateError(f"deployment {deployment_id} interrupted; resume with --deployment-id {deployment_id}")
    if state != SUCCEEDED:
        raise UpdateError(f"deployment {deployment_id} {state}: {summary['reason']}")


def _follow(client: Any, deployment_id: str, as_json: bool, poll_s: float = 1.0) -> None:
    """Print a service-owned deployment's progress until it ends; its end decides the exit."""
    from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES, SUCCEEDED

    if not as_json:
        console().print(f"deployment {deployment_id} on {client.server}")
    last: Any = None
    told: set[tuple[str, str]] = set()
    try:
        while True:
            summary = client.deployment(deployment_id)
            if not as_json and (summary["state"], summary["by_state"]) != last:
                states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(summary["by_state"].items()))
                console().print(f"{summary['state'].lower()}: wave {summary['wave']}: {states}")
                last = (summary["state"], summary["by_state"])
            for device in summary.get("device_states", []):
                # A refusal the service counted (its reason reads "refused by DEVICE: …"): say it now.
                seen = (device["device_id"], device["reason"])
                if not as_json and device["reason"].startswith("refused by ") and seen not in told:
                    told.add(seen)
                    console().print(device["reason"])
            if summary["state"] in FINISHED_ROLLOUT_STATES:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        raise UpdateError(
            f"stopped following {deployment_id}; the service keeps driving it (fleet status {deployment_id} --server …)"
        ) from None
    summary.pop("device_states", None)
    summary.pop("timeline", None)
    summary.pop("security_events", None)
    if as_json:
        print_json(summary)
    else:
        _print_summary(summary)
    if summary["state"] != SUCCEEDED:
        raise UpdateError(f"deployment {deployment_id} {summary['state']}: {summary['reason']}")


def _print_summary(summary: dict[str, Any]) -> None:
    rows = [
        (wave, ", ".join(f"{k} {v}" for k, v in sorted(states.items()))) for wave, states in summary["waves"].items()
    ]
    print_table(
        f"{summary['deployment_id']}: {summary['state']} — {summary['model']}",
        ["wave", "devices by state"],
        rows,
    )
    if summary["reason"]:
        console().print(summary["reason"])


@click.command("status")
@click.argument("deployment", required=False)
@_db_option
@server_options
@model_option
@json_option
def status(
    deployment: str | None,
    db_path: Path | None,
    as_json: bool,
    server: str | None,
    token_file: Path | None,
    model_name: str | None,
) -> None:
    """Show all deployments (and each model's latest rollout), or one deployment's devices."""
    client = service_client({"server": server, "token_file": token_file})
    if client is not None:
        _service_status(client, deployment, as_json, model_name)
        return
    store = _store(db_path)
    if deployment is None:
        rows = keep_model([store.summary(row.id) for row in store.all()], model_name)
        if as_json:
            print_json(rows)
            return
        _print_listing(rows)
        return
    summary = store.summary(deployment)
    check_deployment_model(summary, model_name)
    devices = store.devices(deployment)
    if as_json:
        summary["device_states"] = [
            {
                "device_id": d.device_id,
                "wave": d.wave,
                "state": d.state,
                "reason": d.reason,
                "progress": d.progress,
                "model_release": d.model_release,
            }
            for d in devices
        ]
        print_json(summary)
        return
    _print_summary(summary)
    print_table(
        None,
        ["device", "wave", "state", "release", "reason"],
        [(d.device_id, d.wave, d.state, d.model_release, d.reason) for d in devices],
    )


def _service_status(client: Any, deployment: str | None, as_json: bool, model_name: str | None) -> None:
    if deployment is None:
        rows = keep_model(client.deployments(), model_name)
        if as_json:
            print_json(rows)
            return
        _print_listing(rows)
        return
    summary = client.deployment(deployment)
    check_deployment_model(summary, model_name)
    if as_json:
        print_json(summary)
        return
    _print_summary(summary)
    print_table(
        None,
        ["device", "wave", "state", "release", "reason"],
        [(d["device_id"], d["wave"], d["state"], d["model_release"], d["reason"]) for d in summary["device_states"]],
    )


def _print_listing(rows: list[dict[str, Any]]) -> None:
    print_table(
        "deployments",
        ["id", "state", "model", "devices", "by state", "updated"],
        [
            (
                r["deployment_id"],
                r["state"],
                r["model"],
                r["devices"],
                ", ".join(f"{k} {v}" for k, v in sorted(r["by_state"].items())),
                r["updated"],
            )
            for r in rows
        ],
    )
    if len({model_of(r) for r in rows}) > 1:  # devices serving several models: each one's rollout
        print_table("models", ["model", "latest deployment", "state", "devices by state"], per_model_rows(rows))


@click.command("abort")
@click.argument("deployment")
@broker_options(required=False)
@server_options
@_key_option
@_db_option
@click.option("--expires", default=None, help=EXPIRES_HELP.split(";")[0] + " (default: the push's --expires).")
def abort(deployment: str, key_path: Path | None, db_path: Path | None, expires: str | None, **params: Any) -> None:
    """Stop a rollout: no further waves; devices still updating cancel (and roll back if activated)."""
    client = service_client(params)
    if client is not None:
        client.command(deployment, "abort", expires_s=positive_duration(expires) if expires else None)
        console().print(f"deployment {deployment} aborted (on {client.server})")
        return
    require_broker(params)
    store = _store(db_path)
    store.get(deployment)  # unknown id → one clear error before touching the broker
    ctl, client = _controller(store, params, _operator_key(key_path))
    try:
        ctl.abort(deployment, ttl_s=positive_duration(expires) if expires else None)
        time.sleep(0.5)  # let QoS 1 messages leave before disconnecting
    finally:
        client.stop()
    console().print(f"deployment {deployment} aborted")


@click.command("rollback")
@click.argument("deployment", required=False)
@broker_options(required=False)
@server_options
@_key_option
@_db_option
@click.option("--wait", "wait_s", default="60s", show_default=True, help="Wait this long for devices to confirm.")
@click.option("--expires", default=None, help=EXPIRES_HELP.split(";")[0] + " (default: the push's --expires).")
@model_option
@json_option
def rollback(
    deployment: str | None,
    key_path: Path | None,
    db_path: Path | None,
    wait_s: str,
    expires: str | None,
    model_name: str | None,
    as_json: bool,
    **params: Any,
) -> None:
    """Roll every device the deployment reached back to the model it ran before (with --model and no
    DEPLOYMENT: that model's latest deployment; the devices' other models are not touched)."""
    from edgesdk.fleet.rollout import parse_duration

    if deployment is None and model_name is None:
        raise UsageError("give the DEPLOYMENT to roll back, or --model NAME for that model's latest one")
    timeout = parse_duration(wait_s, option="--wait")
    client = service_client(params)
    if client is not None:
        rows = client.deployments()
        deployment = deployment or latest_of_model(rows, model_name or "")
        check_deployment_model(client.deployment(deployment), model_name)
        _service_rollback(client, deployment, timeout, positive_duration(expires) if expires else None, as_json)
        return
    require_broker(params)
    store = _store(db_path)
    if deployment is None:
        deployment = latest_of_model([store.summary(row.id) for row in store.all()], model_name or "")
    check_deployment_model(store.summary(deployment), model_name)
    before = {d.device_id: d.state for d in store.devices(deployment)}
    ctl, client = _controller(store, params, _operator_key(key_path))
    try:
        asked = ctl.rollback(deployment, ttl_s=positive_duration(expires) if expires else None)
        confirmed = ctl.wait_for_states(deployment, {"ROLLED_BACK", "FAILED", "TIMED_OUT"}, timeout)
    finally:
        client.stop()
    summary = store.summary(deployment)
    after = [
        {"device_id": d.device_id, "state": d.state, "reason": d.reason, "wave": d.wave}
        for d in store.devices(deployment)
    ]
    not_rolled_back = _rollback_refusals(before, after)
    if as_json:
        print_json(summary)
    elif not_rolled_back:
        _print_refusals(deployment, not_rolled_back)
    else:
        _print_summary(summary)
    _check_rolled_back(deployment, asked, not_rolled_back)
    if not confirmed:
        raise UpdateError(f"asked {asked} devices to roll back; not all confirmed within {wait_s} (see fleet status)")


def _rollback_refusals(before: dict[str, str], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Devices that served the deployment's model when asked and answered the rollback FAILED
    (refused it, or had nothing to roll back to: a first install). One that had not activated it
    yet ends FAILED too (cancelled before activation), still on its old model: that is no refusal."""
    return [d for d in after if d["state"] == "FAILED" and before.get(d["device_id"]) in _NEW_MODEL_ACTIVE]


#: Device states in which the deployment's model is the one serving.
_NEW_MODEL_ACTIVE = frozenset({"ACTIVATING", "PROBATION", "COMMITTED"})


def _print_refusals(deployment: str, devices: list[dict[str, Any]]) -> None:
    print_table(
        f"{deployment}: rollback not done",
        ["device", "state", "reason"],
        [(d["device_id"], d["state"], d["reason"]) for d in devices],
    )


def _check_rolled_back(deployment: str, asked: int, refused: list[dict[str, Any]]) -> None:
    """One line naming every device that did not roll back and why (non-zero exit)."""
    if refused:
        reasons = "; ".join(f"{d['device_id']}: {d['reason']}" for d in refused)
        raise UpdateError(
            f"rollback of {deployment} not done on {len(refused)} of {asked} device(s), still serving its model: {reasons}"
        )


def _service_rollback(client: Any, deployment: str, timeout: float, expires_s: float | None, as_json: bool) -> None:
    """Ask the service to roll the deployment back, then wait for the devices to confirm."""
    before = {d["device_id"]: d["state"] for d in client.deployment(deployment)["device_states"]}
    asked = client.command(deployment, "rollback", expires_s=expires_s).get("asked", 0)
    deadline = time.monotonic() + timeout
    while True:
        summary = client.deployment(deployment)
        reached = [d for d in summary["device_states"] if d["state"] != "PENDING"]
        confirmed = all(d["state"] in ("ROLLED_BACK", "FAILED", "TIMED_OUT") for d in reached)
        if confirmed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    not_rolled_back = _rollback_refusals(before, summary["device_states"])
    if as_json:
        print_json(summary)
    elif not_rolled_back:
        _print_refusals(deployment, not_rolled_back)
    else:
        _print_summary(summary)
    _check_rolled_back(deployment, asked, not_rolled_back)
    if not confirmed:
        raise UpdateError(f"asked {asked} devices to roll back; not all confirmed in time (see fleet status --server)")
