"""Ports: what each part of the agent needs from the others, as small ``typing.Protocol``s.

The daemon (:class:`edgesdk.agent.daemon.Agent`) builds the parts and hands each one only
the ports it uses, through its constructor. So the MQTT link, the updater and the metrics
never see the whole agent, a test can pass a small stand-in for any port, and what one
part may do to another is written down here, once.

=====================  ================================  ==========================
port                   provided by                       used by
=====================  ================================  ==========================
RunningModelSource     ModelServer (and Metrics)         Metrics, AgentLink, updater
RunningModelsSource    DeviceModels                          AgentLink (presence), Metrics
Serving                ModelServer                       Metrics, AgentUpdateTarget
Slots                  SlotStore                        AgentUpdateTarget
Keyring                KeyFiles (Agent.keyring)          updater, AgentLink
BundleOpener           edgesdk.agent.openers             AgentUpdateTarget, Agent
TelemetrySource        Metrics                           AgentLink
AnswerTaps             ModelServer                       drift monitor, shadow
EventSink              EventBus                          UpdateManager
EventSource            EventBus                          AgentLink
UpdateChannel          AgentLink                         UpdateManager, target
GovernorReadout        Governor                          Metrics
OutboxGauge            MessageQueue (AgentLink.queue)    Metrics
RunningParts           Agent (agent/daemon.py)           AgentLifecycle
=====================  ================================  ==========================

docs/architecture.md ("Ports inside the agent") has the same table with what each offers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgesdk.schemas.base import Schema
from edgesdk.schemas.messages import RunningModel

if TYPE_CHECKING:  # the key types import cryptography; the daemon must not at start
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.governor.sensors import SensorReading
    from edgesdk.agent.runtimes.base import LoadedModel
    from edgesdk.agent.serving import ServedModel, Tap

    from edgesdk.schemas.manifest import Variant
    from edgesdk.schemas.messages import ModelQuality


class RunningModelSource(Protocol):
    """Says what is serving now (None before a model is loaded)."""

    def running_model(self) -> RunningModel | None: ...


class RunningModelsSource(Protocol):
    """Says what every model of the device is serving now (default model first)."""

    def running_models(self) -> list[RunningModel]: ...


class ModelReadout(Protocol):
    """One model's figures for telemetry and ``/metrics`` (a ``ModelParts``)."""

    name: str

    def running_model(self) -> RunningModel | None: ...

    def resident_mb(self) -> float | None: ...

    @property
    def stats(self) -> Any: ...


class ModelsReadout(Protocol):
    """Every model's figures and the memory budget (``DeviceModels``)."""

    def entries(self) -> Sequence[ModelReadout]: ...

    def memory(self) -> dict[str, Any]: ...


class Serving(RunningModelSource, Protocol):
    """What serves: the loaded model, how often its precision switched, and the swap to another."""

    @property
    def model(self) -> ServedModel | None: ...

    @property
    def switch_count(self) -> int: ...

    def swap(
        self, verified_bundle: Any, device_key: Any, *, decrypt: Callable[..., dict[str, bytes]] | None = None
    ) -> ServedModel: ...

    def serve(
        self,
        *,
        name: str,
        version: str,
        release: int,
        variants: Sequence[tuple[Variant, LoadedModel]],
        bundle_sha256: str | None = None,
        start_variant: str | None = None,
    ) -> ServedModel: ...


class Slots(Protocol):
    """The A/B bundle slots on disk, as the updater uses them (stage, activate, commit, roll back)."""

    @property
    def slots_dir(self) -> Path: ...

    @property
    def active_slot(self) -> Any: ...

    @property
    def committed(self) -> bool: ...

    @property
    def previous_slot(self) -> Any:
        """The slot that served before the active one (the rollback target and the shadow's
        reference), or None."""
        ...

    def reload(self) -> None: ...

    def installed_release(self) -> int | None: ...

    def rollback_floor(self) -> int | None: ...

    def slot_info(self, slot: Any) -> dict[str, Any] | None: ...

    def bundle_path(self, slot: Any) -> Path: ...

    def stage(self, verified: Any) -> Any: ...

    def activate(self, slot: Any) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> Any: ...


class Keyring(Protocol):
    """The device's keys and the keys it trusts per role, read on first use (so a daemon whose
    bundles open in the unseal helper never imports the crypto library at start).
    ``device_public_key`` is all the link needs: with ``unseal = "helper"`` nothing in the
    daemon reads ``device_key``."""

    @property
    def device_key(self) -> X25519PrivateKey: ...

    @property
    def trusted_publishers(self) -> list[Ed25519PublicKey]:
        """Keys that may sign bundles."""
        ...

    @property
    def trusted_operators(self) -> list[Ed25519PublicKey]:
        """Keys that may sign deployments, rollbacks and aborts (raises TrustError when none may)."""
        ...

    def device_public_key(self) -> bytes | None: ...


class BundleOpener(Protocol):
    """Verifies and decrypts bundles for one piece of work (an update state, a sideload), in
    this process or in the unseal helper; closed when that work ends (the helper exits)."""

    def verify(
        self, path: Path, *, profile: str | None, installed_release: int | None, rollback_floor: int | None = None
    ) -> Any: ...

    def decrypt(self, bundle: Any, variant_id: str) -> dict[str, bytes]: ...

    def golden(self, bundle: Any) -> dict[str, Any] | None: ...

    def serve(self, serving: Serving, bundle: Any) -> ServedModel: ...

    def close(self) -> None: ...


class TelemetrySource(Protocol):
    """The agent's own measurements: the Telemetry fields the link does not fill itself."""

    def snapshot(self) -> dict[str, Any]: ...

    def quality_reports(self) -> dict[str, ModelQuality]:
        """Each model's closed drift window since the last call (empty when none closed)."""
        ...


class AnswerTaps(Protocol):
    """A server whose answers can be watched: the API calls each of ``taps`` with every answer."""

    taps: list[Tap]


EventHandler = Callable[[str, dict[str, Any]], None]


class EventSink(Protocol):
    """Where a part reports what happened (precision switches, OTA states, ...)."""

    def emit(self, name: str, detail: dict[str, Any] | None = None) -> None: ...


class EventSource(Protocol):
    """Where a part hears what happened; ``subscribe`` returns the function that unsubscribes."""

    def subscribe(self, fn: EventHandler) -> Callable[[], None]: ...


class UpdateChannel(Protocol):
    """The MQTT link as the updater sees it: its device topics in, statuses and requests out."""

    def subscribe(self, suffix: str, handler: Callable[[bytes], None]) -> None: ...

    def publish_reliable(self, suffix: str, model: Schema) -> int: ...

    def publish_now(self, suffix: str, payload: bytes | Schema, qos: int = 0) -> bool: ...


class GovernorReadout(Protocol):
    """The precision governor's state and the last sensor reading it acted on."""

    @property
    def state(self) -> str: ...

    @property
    def last_reading(self) -> SensorReading: ...


class OutboxGauge(Protocol):
    """The MQTT store-and-forward outbox: messages waiting for the broker, and those dropped."""

    @property
    def depth(self) -> int: ...

    @property
    def dropped(self) -> int: ...


class ConnectionGauge(Protocol):
    """The local API's HTTP connections: open now, and those it turned away or closed to make room."""

    @property
    def open_connections(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def evicted(self) -> int: ...


class RunningParts(Protocol):
    """What the lifecycle (``agent/lifecycle.py``) starts and stops around the API, in this order:
    the OTA boot guard, the models, the governors, the rest (link, updaters, profiling)."""

    def guard_boot(self) -> None: ...

    def load_installed(self) -> bool: ...

    def start_governors(self) -> None: ...

    def start_parts(self) -> None: ...

    def reload(self) -> None: ...

    def stop_parts(self) -> None: ...


__all__ = [
    "BundleOpener",
    "EventHandler",
    "EventSink",
    "EventSource",
    "GovernorReadout",
    "Keyring",
    "OutboxGauge",
    "RunningModelSource",
    "RunningParts",
    "Serving",
    "Slots",
    "TelemetrySource",
    "UpdateChannel",
]
