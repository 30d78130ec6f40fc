"""``edge-agent``: run the device agent, sideload a bundle, show the device key and status.

    edge-agent run --config /etc/edgesdk/agent.toml
    edge-agent install --config /etc/edgesdk/agent.toml model.edgepkg
    edge-agent key --config ...          (the device public key, for enrollment)
    edge-agent status --config ...       (asks the running agent over its local API)
    edge-agent profile --config ...      (times every variant of the installed model on this device)
    edge-agent trust install --config ... trust.json   (a newer root-signed trust document)
    edge-agent security-state seed --config ...   (once: after an upgrade, or for a device key made elsewhere)

Every user error is one ``error: ...`` line; exit status 2 for a usage error (an unknown option,
a missing argument or ``--config``), 1 for every other error (same as ``edgesdk``: edgesdk/cli/main.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from edgesdk._version import __version__
from edgesdk.console import run_cli
from edgesdk.errors import AgentError

CONFIG_ENV = "EDGESDK_AGENT_CONFIG"
_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CONFIG_ENV,
    default=None,
    help=f"Agent config (TOML); also ${CONFIG_ENV}. Environment EDGESDK_AGENT__SECTION__KEY overrides.",
)


def _load(config_path: Path | None):  # type: ignore[no-untyped-def]
    from edgesdk.agent.config import load_config

    if config_path is None and not any(k.startswith("EDGESDK_AGENT__") for k in os.environ):
        raise click.UsageError("no configuration: pass --config FILE (or set EDGESDK_AGENT_CONFIG)")
    return load_config(config_path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edge-agent", message="%(prog)s %(version)s")
def cli() -> None:
    """edge-agent: the edgesdk device agent (offline inference, precision governor, metrics)."""


@cli.command()
@_config_option
def run(config_path: Path | None) -> None:
    """Run the agent until SIGTERM (drains requests in flight first)."""
    config = _load(config_path)
    from edgesdk.agent.daemon import Agent
    from edgesdk.agent.logs import setup_logging

    setup_logging(config.log_level, config.log_format)
    code = Agent(config).run()
    if code:
        raise click.exceptions.Exit(code)


@cli.command()
@_config_option
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-reload", is_flag=True, help="Do not signal a running agent to load the new bundle.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def install(config_path: Path | None, bundle: Path, no_reload: bool, as_json: bool) -> None:
    """Sideload BUNDLE (.edgepkg): verify, stage, prove it loads, commit; then tell a running agent."""
    config = _load(config_path)
    if not bundle.is_file():
        raise AgentError(f"bundle {str(bundle)!r} not found")
    from edgesdk.agent.daemon import PID_FILE, Agent
    from edgesdk.agent.logs import setup_logging

    setup_logging("warning", "text")
    agent = Agent(config)
    result = agent.install(bundle)
    reloaded = False if no_reload else _signal_running_agent(Path(config.data_dir) / PID_FILE)
    result["running_agent_reloaded"] = reloaded
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(
            f"installed {result.get('model')} {result.get('version')} (release {result.get('release')}) "
            f"into slot {result.get('slot')}"
            + ("; the running agent is loading it" if reloaded else "; it serves from the next agent start")
        )


def _signal_running_agent(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True


@cli.command()
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print device id, key id, base64 key and PEM as one JSON object.")
def key(config_path: Path | None, as_json: bool) -> None:
    """Print this device's key id and X25519 public key (PEM), creating the key pair if needed.

    The first line is ``key id: <32 hex digits>``, the whole id: the operator compares it with
    ``edgesdk fleet enroll list`` and passes it to ``approve --key-id`` (a prefix is never shown,
    since a key matching a short prefix can be ground). The PEM follows; PEM readers skip the
    line before it, so ``edge-agent key > cam-07.pub`` is still a key file."""
    config = _load(config_path)
    from cryptography.hazmat.primitives import serialization
    from edgesdk.agent.daemon import Agent
    from edgesdk.agent.keyring import public_key_text, raw_key_id

    agent = Agent(config)
    public = agent.device_key.public_key()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    kid = raw_key_id(public.public_bytes_raw())
    if as_json:
        shown = {"device_id": config.device_id, "key_id": kid, "public_key": public_key_text(public.public_bytes_raw())}
        click.echo(json.dumps({**shown, "pem": pem.decode()}))
        return
    click.echo(f"key id: {kid}")
    click.echo(pem.decode().strip())


@cli.command()
@_config_option
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="Untimed runs first.")
@click.option("--runs", type=click.IntRange(min=1), default=50, show_default=True, help="Timed runs per variant.")
@click.option(
    "--emulated",
    is_flag=True,
    help="Mark the figures as measured under emulation (the arm64 lane): the planner then takes sizes "
    "and memory from them, never speed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def profile(config_path: Path | None, warmup: int, runs: int, emulated: bool, as_json: bool) -> None:
    """Time every variant of the installed model on this device (load, latency, memory)."""
    config = _load(config_path)
    from edgesdk.agent.daemon import Agent
    from edgesdk.agent.logs import setup_logging
    from edgesdk.agent.profiling import profile_installed

    setup_logging("warning", "text")
    # A running agent shows the saved figures in /v1/status and orders its ladder by them at
    # its next load of this model (start, SIGHUP after an install, or an update).
    result = profile_installed(Agent(config), warmup=warmup, runs=runs, emulated=emulated)
    if as_json:
        click.echo(result.model_dump_json())
        return
    click.echo(f"{result.model} {result.version} on {result.device_id} ({result.profile}, {result.machine})")
    for r in result.runtimes:
        disk = f"  installed {r.installed_mb:7.1f} MB" if r.installed_mb is not None else ""
        click.echo(f"  runtime {r.runtime:<12} import {r.import_ms:9.1f} ms  rss {r.rss_mb:+7.1f} MB{disk}")
    for m in result.variants:
        click.echo(
            f"  {m.variant:<20} load {m.load_ms:9.1f} ms  rss {m.rss_mb:+7.1f} MB  "
            f"p50 {m.p50_ms:9.3f} ms  p95 {m.p95_ms:9.3f} ms  ({m.runs} runs, batch {m.batch})"
        )
    click.echo("speed ladder: " + " -> ".join(result.speed_ladder))
    for variant, why in result.not_steps.items():
        click.echo(f"  not a step: {variant}: {why}")


@cli.command()
@_config_option
def status(config_path: Path | None) -> None:
    """Ask the running agent for /v1/status (over loopback)."""
    import urllib.error
    import urllib.request

    from edgesdk.agent.daemon import PORT_FILE

    config = _load(config_path)
    port_file = Path(config.data_dir) / PORT_FILE
    try:
        port = int(port_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise AgentError(f"no running agent found ({port_file} missing)") from exc
    host = config.api.host if config.api.host not in ("0.0.0.0", "::") else "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v1/status", timeout=5) as response:  # noqa: S310 - loopback
            click.echo(json.dumps(json.loads(response.read()), indent=2))
    except (urllib.error.URLError, OSError) as exc:
        raise AgentError(f"agent on port {port} does not answer: {exc}") from exc


@cli.group()
def trust() -> None:
    """The trust document: which keys may sign bundles and deployments on this device."""


@trust.command("install")
@_config_option
@click.argument("document", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-reload", is_flag=True, help="Do not signal a running agent to re-read it.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def trust_install(config_path: Path | None, document: Path, no_reload: bool, as_json: bool) -> None:
    """Install DOCUMENT if the trusted root signed it and its version is newer (rotation, revocation)."""
    config = _load(config_path)
    if config.trust_document is None:
        raise AgentError("this agent has no trust_document configured: there is no root to check a new one against")
    from edgesdk.agent.daemon import PID_FILE
    from edgesdk.agent.trust import AgentTrust

    try:
        raw = document.read_bytes()
    except OSError as exc:
        raise AgentError(f"trust document {str(document)!r}: {exc.strerror or exc}") from exc
    from edgesdk.agent.security_state import for_config

    trust_store = AgentTrust(Path(config.trust_document), Path(config.data_dir), state=for_config(config))
    installed, changed = trust_store.install(raw, source=f"trust document {document}")
    reloaded = changed and not no_reload and _signal_running_agent(Path(config.data_dir) / PID_FILE)
    result = {"version": installed.version, "changed": changed, "path": str(trust_store.persisted)}
    result["running_agent_reloaded"] = reloaded
    if as_json:
        click.echo(json.dumps(result))
    elif changed:
        click.echo(
            f"installed trust document version {installed.version}"
            + ("; the running agent re-reads it" if reloaded else "")
        )
    else:
        click.echo(f"trust document version {installed.version} is already the one in force")


@cli.group("security-state")
def security_state() -> None:
    """The record of trust document, release floors and command ledger (agent/security_state.py)."""


@security_state.command("seed")
@_config_option
@click.option(
    "--floor",
    "floors",
    multiple=True,
    metavar="MODEL=RELEASE",
    help="A model's release floor, where the files cannot say it (repeatable).",
)
@click.option("--replace-valid", is_flag=True, help="Replace a record that is present and valid.")
def security_state_seed(config_path: Path | None, floors: tuple[str, ...], replace_valid: bool) -> None:
    """Write the security state from the data dir's files as they are now: once after upgrading
    from an agent without one or for a device key made outside the agent, or to re-provision a
    device reported tampered with (after an operator has checked its files; remotely:
    edgesdk fleet reprovision). Needs the device key; stop the agent first."""
    config = _load(config_path)
    from edgesdk.agent.security_state import for_config, record_from_files

    parsed: dict[str, int] = {}
    for item in floors:
        name, _, value = item.partition("=")
        if not name or not value.isdigit():
            raise AgentError(f"--floor {item!r} is not MODEL=RELEASE (e.g. --floor digits=3)")
        parsed[name] = int(value)
    state = for_config(config)
    record = record_from_files(config, parsed)
    state.seed(record, replace_valid=replace_valid)
    floors_text = ", ".join(f"{k}={v}" for k, v in sorted(record.release_floors.items())) or "none"
    click.echo(
        f"seeded {state.path}: trust document "
        + (f"version {record.trust_version}" if record.trust_version is not None else "of the image")
        + f", release floors {floors_text}, command ledger of {len(record.ledger)} key(s)"
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point for ``edge-agent``."""
    one_blas_thread()
    sys.exit(run_cli(cli, argv, prog_name="edge-agent"))


def one_blas_thread() -> None:
    """numpy's OpenBLAS, unless told otherwise, starts a worker thread per core and splits
    large calls between them. The agent's BLAS calls are the NaN/Inf scan's dot products:
    a 602 KB MobileNetV2 input's takes 12.2 µs on one thread and on two here, at 13.3 µs of
    CPU instead of 12.2 (a second thread woken beside the model runtime's own, for nothing;
    the one-off benchmarks/probe_blas_threads.py, in git at e3a1c3b). OpenBLAS reads this when numpy loads, which nothing has done yet here; an
    operator's own setting stays."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


if __name__ == "__main__":
    main()
