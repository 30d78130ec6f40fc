"""Reading the agent's configuration: a TOML file, then environment overrides, then one
validation against :class:`~edgesdk.schemas.agent_config.AgentConfig`.

``EDGESDK_AGENT__API__PORT=9000`` sets ``api.port``: the prefix, then the path of the key
with double underscores between levels. Values are read as TOML values when they parse as
one (``9000``, ``true``, ``["a", "b"]``) and as plain strings otherwise, so
``EDGESDK_AGENT__PROFILE=rpi5-8gb`` needs no quotes. Relative paths in the file are taken
relative to the file's directory, so a config and its keys can travel together.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgesdk.errors import ConfigError, SchemaError
from edgesdk.schemas.agent_config import AgentConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 devices
    import tomli as tomllib

ENV_PREFIX = "EDGESDK_AGENT__"

#: Dotted keys holding paths; resolved against the config file's directory when relative.
_PATH_KEYS = (
    ("data_dir",),
    ("device_key",),
    ("trust_document",),
    ("api", "unix_socket"),
    ("capture", "operator_public_key"),
    ("governor", "trace_file"),
    ("mqtt", "password_file"),
    ("mqtt", "tls", "ca_file"),
    ("mqtt", "tls", "cert_file"),
    ("mqtt", "tls", "key_file"),
    ("ota", "http_ca_file"),
)


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The nested mapping described by ``EDGESDK_AGENT__*`` variables."""
    tree: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"environment variable {name!r}: empty key part (use double underscores between levels)")
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = _parse_env_value(raw)
    return tree


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolve_paths(data: dict[str, Any], base_dir: Path) -> None:
    for key_path in _PATH_KEYS:
        node: Any = data
        for part in key_path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        value = node.get(key_path[-1])
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            node[key_path[-1]] = str(base_dir / value)
    keys = data.get("publisher_keys")
    if isinstance(keys, list):
        data["publisher_keys"] = [
            str(base_dir / k) if isinstance(k, str) and not Path(k).expanduser().is_absolute() else k for k in keys
        ]


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw TOML mapping of ``path``, relative paths resolved; ConfigError if unreadable."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {str(path)!r} not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc
    _resolve_paths(data, path.resolve().parent)
    return data


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """File (optional) + environment overrides → a validated AgentConfig, or one ConfigError."""
    environ = os.environ if environ is None else environ
    data = read_config_file(path) if path is not None else {}
    data = _merge(data, env_overrides(environ))
    source = f"config {str(path)!r}" if path is not None else "config (environment)"
    try:
        return AgentConfig.parse_obj_clear(data, source=source)
    except SchemaError as exc:
        raise ConfigError(str(exc)) from exc


def check_configured_files(config: AgentConfig) -> None:
    """Refuse, in one line, a configured file that is not there, as the key files are refused.

    Read only later (an HTTP download, hours after the start), a missing ``[ota] http_ca_file``
    would surface as a TLS failure of one update; the operator learns of it at start instead."""
    ca_file = config.ota.http_ca_file
    if ca_file is not None and not Path(ca_file).is_file():
        raise ConfigError(
            f"[ota] http_ca_file {str(ca_file)!r} does not exist: put the fleet CA certificate there, "
            "or remove the setting (the default is the MQTT link's tls.ca_file, else the system's CAs)"
        )
