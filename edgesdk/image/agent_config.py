"""The agent configuration a provisioning image installs as ``/etc/edgesdk/agent.toml``.

Two values are only known on the device, so the file carries placeholders that ``install.sh``
fills in: ``@DEVICE_ID@`` (``--device-id``, else the host name) and ``@ROOT@`` (empty on a
device; the staging directory with ``--root``). Everything else is validated against
:class:`~edgesdk.schemas.agent_config.AgentConfig` here, at build time, so a bad value fails on
the operator's machine and not on a device in the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from edgesdk.errors import ImageError, SchemaError
from edgesdk.image import toml_writer
from edgesdk.schemas.agent_config import AgentConfig

DEVICE_ID_PLACEHOLDER = "@DEVICE_ID@"
ROOT_PLACEHOLDER = "@ROOT@"
CONFIG_DIR = PurePosixPath("/etc/edgesdk")
STATE_DIR = PurePosixPath("/var/lib/edgesdk")
RUNTIME_DIR = PurePosixPath("/run/edgesdk")
CONFIG_FILE = CONFIG_DIR / "agent.toml"
CA_FILE = CONFIG_DIR / "ca.pem"
PUBLISHERS_DIR = CONFIG_DIR / "publishers"
#: The initial trust document (root-owned; newer ones the agent installs go to its data dir).
TRUST_FILE = CONFIG_DIR / "trust.json"
PROFILES_DIR = CONFIG_DIR / "profiles"
#: Where the agent makes its key pair on first start (``device_key`` is left unset on purpose:
#: a configured key file must already exist, the default one is created when missing).
DEVICE_KEY_FILE = STATE_DIR / "device.key"
DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


def check_broker_url(url: str) -> str:
    """``url`` if it is ``mqtt://HOST[:PORT]`` or ``mqtts://HOST[:PORT]``; else ImageError."""
    hint = "expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ImageError(f"broker URL {url!r} is invalid ({exc}); {hint}") from exc
    if parts.scheme not in DEFAULT_PORTS:
        raise ImageError(f"broker URL {url!r} has scheme {parts.scheme or '(none)'!r}; {hint}")
    if not parts.hostname:
        raise ImageError(f"broker URL {url!r} has no host; {hint}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ImageError(f"broker URL {url!r} must not carry a path, query or credentials; {hint}")
    if port == 0:
        raise ImageError(f"broker URL {url!r} has port 0; {hint}")
    return url.rstrip("/")


@dataclass(frozen=True)
class ProvisioningConfig:
    """What the operator chose for every device that installs the image."""

    profile: str
    broker: str
    has_ca: bool = False
    publisher_key_names: list[str] = field(default_factory=list)
    has_trust_document: bool = False
    groups: list[str] = field(default_factory=list)
    namespace: str = "edgesdk"
    api_port: int = 8470


def agent_config_document(settings: ProvisioningConfig) -> dict[str, Any]:
    """The config as a mapping, with device paths (no placeholders) and a sample device id."""
    mqtt: dict[str, Any] = {
        "enabled": True,
        "broker": settings.broker,
        "namespace": settings.namespace,
        "groups": list(settings.groups),
    }
    if settings.has_ca:
        mqtt["tls"] = {"ca_file": str(CA_FILE)}
    elif settings.broker.startswith("mqtts://"):
        mqtt["tls"] = {}  # TLS against the system's CA store
    trust = {"trust_document": str(TRUST_FILE)} if settings.has_trust_document else {}
    return {
        "schema_version": 1,
        "device_id": "unprovisioned",
        "profile": settings.profile,
        "data_dir": str(STATE_DIR),
        "publisher_keys": [str(PUBLISHERS_DIR / name) for name in settings.publisher_key_names],
        **trust,
        "log_level": "info",
        "log_format": "journald",
        "api": {"host": "127.0.0.1", "port": settings.api_port, "unix_socket": str(RUNTIME_DIR / "agent.sock")},
        "mqtt": mqtt,
    }


def _with_placeholders(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _with_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_placeholders(v) for v in value]
    if isinstance(value, str) and value.startswith(("/etc/edgesdk", "/var/lib/edgesdk", "/run/edgesdk")):
        return ROOT_PLACEHOLDER + value
    return value


def render_agent_config(settings: ProvisioningConfig) -> str:
    """TOML text of ``agent.toml`` with ``@ROOT@``/``@DEVICE_ID@`` placeholders; validated first."""
    document = agent_config_document(settings)
    try:
        AgentConfig.parse_obj_clear(document, source="agent config")
    except SchemaError as exc:
        raise ImageError(str(exc)) from exc
    rendered = _with_placeholders(document)
    rendered["device_id"] = DEVICE_ID_PLACEHOLDER
    header = (
        f"edgesdk agent configuration, written by `edgesdk image build` for profile {settings.profile}.\n"
        "Environment variables override it: EDGESDK_AGENT__API__PORT=9000 sets api.port."
    )
    return toml_writer.dumps(rendered, header=header)


def fill_placeholders(text: str, *, device_id: str, root: str = "") -> str:
    """What install.sh does to the rendered files (used by tests and tools that stage images)."""
    return text.replace(ROOT_PLACEHOLDER, root).replace(DEVICE_ID_PLACEHOLDER, device_id)
