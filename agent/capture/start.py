"""Starting capture from the agent's ``[capture]`` table (one call from agent/daemon.py).

Off unless ``rate`` > 0. On, it needs the operator's public key (no key: one ConfigError line at
start, never a capture written in the clear) and, if named, a redaction hook that imports."""

from __future__ import annotations

import atexit
import importlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import ConfigError, EdgeSDKError, KeyFileError
from edgesdk.schemas.agent_config import AgentConfig, CaptureConfig

if TYPE_CHECKING:  # the writer and the keys load the crypto library: only when capture is on
    from edgesdk.agent.capture.writer import CaptureWriter, Redact

log = logging.getLogger("edgesdk.agent.capture")

#: Where capture files go, under the data dir.
CAPTURE_DIR = "capture"


def operator_key(settings: CaptureConfig) -> Any:
    """The operator's X25519 public key, or one ConfigError line saying what to do."""
    from edgesdk.keys import load_device_public_key

    path = settings.operator_public_key
    if path is None:
        raise ConfigError(
            f"[capture] rate is {settings.rate:g} but operator_public_key is not set: make a key with "
            "`edgesdk capture keygen --out DIR` and set operator_public_key to its capture.pub (or set rate = 0)"
        )
    try:
        return load_device_public_key(Path(path))
    except KeyFileError as exc:
        raise ConfigError(f"[capture] operator_public_key: {exc}") from exc


def redaction_hook(spec: str | None) -> Redact | None:
    """The ``module:function`` hook, imported now so that a typo stops the start, not the first record."""
    if spec is None:
        return None
    module_name, _, attr = spec.partition(":")
    try:
        hook = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"[capture] redact {spec!r} cannot be imported ({exc}): name a function as 'module:function' "
            "on the agent's Python path"
        ) from exc
    if not callable(hook):
        raise ConfigError(f"[capture] redact {spec!r} is not a function")
    return hook  # type: ignore[no-any-return]


def describer(models: Any) -> Any:
    """The version and release a model name serves now (read when a request is sampled)."""

    def describe(name: str) -> Mapping[str, Any]:
        try:
            served = models.entry(name).server.model
        except EdgeSDKError:
            return {}
        if served is None:
            return {}
        return {"version": served.version, "release": served.release, "bundle_sha256": served.bundle_sha256}

    return describe


def start_capture(
    config: AgentConfig,
    models: Any,
    data_dir: Path,
    *,
    link: Callable[[], Any] | None = None,
    when_linked: Callable[[Callable[[Any], None]], None] | None = None,
) -> CaptureWriter | None:
    """The running capture writer on the API's taps, or None when capture is off. With ``upload``,
    the files also go to the fleet service through the MQTT link ``link()`` returns (once made);
    ``when_linked(f)`` has ``f(link)`` called when the link is made, before it connects, so the
    uploader's acks are subscribed before the broker hands over those it kept for the device."""
    settings = config.capture
    if settings.rate <= 0:
        return None
    if settings.upload and (not config.mqtt.enabled or link is None):
        raise ConfigError(
            "[capture] upload = true sends capture files over MQTT, but [mqtt] enabled is false: "
            "enable [mqtt] or set upload = false"
        )
    from edgesdk.agent.capture.writer import CaptureWriter

    from edgesdk.keys import key_id

    operator = operator_key(settings)
    writer = CaptureWriter(
        data_dir / CAPTURE_DIR,
        operator,
        rate=settings.rate,
        max_bytes=int(settings.max_mb * 1024 * 1024),
        retention_s=settings.retention_days * 86400,
        device_id=config.device_id,
        redact=redaction_hook(settings.redact),
        describe=describer(models),
    ).start()
    atexit.register(writer.stop, 5.0)  # what is queued at a clean stop is written, not lost
    if settings.upload and link is not None:
        from edgesdk.agent.capture.upload import CaptureUploader

        uploader = CaptureUploader(writer.directory, config.device_id, link)
        if when_linked is not None:
            when_linked(uploader.attach)
        uploader.start()
        atexit.register(uploader.stop, 1.0)
    models.default_server.taps.append(writer.tap)  # the API calls this server's taps for every model
    log.info(
        "capturing %g of answered requests to %s, encrypted to operator key %s",
        settings.rate,
        writer.directory,
        key_id(operator),
    )
    return writer
