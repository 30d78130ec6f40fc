"""The topic scheme: ``{namespace}/devices/{device_id}/{suffix}``, ``{namespace}/groups/{group}/{suffix}``
and, for what the whole fleet reads (the trust document), ``{namespace}/fleet/{suffix}``.

One module builds and parses every topic so that the device, the fleet tools and the broker
ACL (``firmware_images/mosquitto/acl``) agree on one layout. Ids and group names never contain
``/``, ``+`` or ``#``, so a device cannot reach outside its own subtree by choosing its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from edgesdk.errors import UsageError

PRESENCE: Final = "presence"
TELEMETRY: Final = "telemetry"
EVENTS: Final = "events"
OTA_STATUS: Final = "ota/status"
OTA_DEPLOYMENT: Final = "ota/deployment"
#: A device asks for a window of bundle chunks (``ChunkRequest`` JSON, device → fleet).
OTA_CHUNK_REQUEST: Final = "ota/chunks/req"
#: The chunk frames that answer it (``edgesdk.protocol.chunks``, fleet → device).
OTA_CHUNK_DATA: Final = "ota/chunks/data"
ENROLL: Final = "enroll"
#: The device's broker password, sealed to its key, retained by the operator at approval
#: (``MqttCredentials`` JSON, fleet → device).
ENROLL_CREDENTIALS: Final = "enroll/credentials"
#: The fleet's trust document (``TrustDocument`` JSON, retained, fleet → every device) under
#: ``{namespace}/fleet/``: one message for the whole fleet, read by every device.
TRUST: Final = "trust"

#: A finished capture file, sealed to the operator's key (``CaptureUpload`` JSON, device → fleet).
CAPTURE: Final = "capture"
#: The service stored a capture file: the device may delete its copy (``CaptureAck`` JSON, fleet → device).
CAPTURE_ACK: Final = "capture/ack"

#: Suffixes a device publishes under its own id (the ACL grants write on exactly these).
DEVICE_PUBLISHED: Final = (PRESENCE, TELEMETRY, EVENTS, OTA_STATUS, OTA_CHUNK_REQUEST, ENROLL, CAPTURE)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SUFFIX = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")

Scope = Literal["devices", "groups", "fleet"]


def _check(kind: str, value: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(value):
        raise UsageError(f"invalid MQTT {kind} {value!r}: use letters, digits, '.', '_' and '-' (no '/', '+', '#')")
    return value


def device_topic(namespace: str, device_id: str, suffix: str) -> str:
    """Topic of ``suffix`` for one device, e.g. ``edgesdk/devices/rpi-001/telemetry``."""
    return _join(namespace, "devices", device_id, suffix)


def group_topic(namespace: str, group: str, suffix: str) -> str:
    """Topic of ``suffix`` for a device group, e.g. ``edgesdk/groups/line-1/ota/deployment``."""
    return _join(namespace, "groups", group, suffix)


def _join(namespace: str, scope: Scope, name: str, suffix: str) -> str:
    _check("namespace", namespace, _NAMESPACE)
    _check("device id" if scope == "devices" else "group name", name, _NAME)
    _check("topic suffix", suffix, _SUFFIX)
    return f"{namespace}/{scope}/{name}/{suffix}"


def fleet_topic(namespace: str, suffix: str) -> str:
    """Topic of ``suffix`` for every device of the namespace, e.g. ``edgesdk/fleet/trust``."""
    _check("namespace", namespace, _NAMESPACE)
    _check("topic suffix", suffix, _SUFFIX)
    return f"{namespace}/fleet/{suffix}"


def all_devices_filter(namespace: str, suffix: str) -> str:
    """Subscription filter matching ``suffix`` of every device (fleet side)."""
    _check("namespace", namespace, _NAMESPACE)
    _check("topic suffix", suffix, _SUFFIX)
    return f"{namespace}/devices/+/{suffix}"


@dataclass(frozen=True)
class ParsedTopic:
    """A topic split back into its parts (``name`` is empty for the fleet scope)."""

    scope: Scope
    name: str
    suffix: str


def parse_topic(namespace: str, topic: str) -> ParsedTopic | None:
    """Split a topic of this namespace; ``None`` when it is not one of ours."""
    prefix = namespace + "/"
    if not topic.startswith(prefix):
        return None
    rest = topic[len(prefix) :]
    if rest.startswith("fleet/"):
        suffix = rest[len("fleet/") :]
        return ParsedTopic(scope="fleet", name="", suffix=suffix) if _SUFFIX.match(suffix) else None
    parts = rest.split("/", 2)
    if len(parts) != 3 or parts[0] not in ("devices", "groups"):
        return None
    scope, name, suffix = parts
    if not _NAME.match(name) or not _SUFFIX.match(suffix):
        return None
    return ParsedTopic(scope="devices" if scope == "devices" else "groups", name=name, suffix=suffix)
