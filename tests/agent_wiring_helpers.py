"""Wire an agent's MQTT link and updater from an agent-shaped stand-in, as tests and benchmarks do.

The daemon wires both itself (``FleetConnection`` in agent/fleet_connection.py) with more parts
(several models, the command gate, the memory budget); these two build the plain one-model
version from whatever object has the few attributes below, so a test needs no daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from edgesdk.agent.link import AgentLink
from edgesdk.agent.ota.freshness import CommandGate
from edgesdk.agent.ota.hooks import OtaHooks
from edgesdk.agent.ota.manager import UpdateManager, transfer_settings
from edgesdk.agent.ports import (
    EventSink,
    EventSource,
    Keyring,
    RunningModelSource,
    Serving,
    Slots,
    TelemetrySource,
    UpdateChannel,
)

from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.profile import DeviceProfile


class AgentMeasurements(TelemetrySource, RunningModelSource, Protocol):
    """Metrics as the link reads them: the telemetry snapshot and the model serving."""


class LinkedAgent(Keyring, Protocol):
    """What :func:`start_link` needs of an agent."""

    @property
    def config(self) -> AgentConfig: ...

    @property
    def metrics(self) -> AgentMeasurements: ...

    @property
    def events(self) -> EventSource: ...


class UpdatableAgent(Keyring, Protocol):
    """What :func:`updater_for` needs of an agent."""

    @property
    def config(self) -> AgentConfig: ...

    @property
    def profile(self) -> DeviceProfile: ...

    @property
    def server(self) -> Serving: ...

    @property
    def store(self) -> Slots: ...

    @property
    def events(self) -> EventSink: ...

    @property
    def link(self) -> UpdateChannel | None: ...


def start_link(agent: LinkedAgent) -> AgentLink:
    """Build and start the MQTT link of ``agent``: its metrics, events and keys as the ports."""
    return AgentLink(
        agent.config, telemetry=agent.metrics, running_model=agent.metrics, events=agent.events, keyring=agent
    ).start()


def updater_for(
    agent: UpdatableAgent, *, hooks: OtaHooks | None = None, gate: CommandGate | None = None
) -> UpdateManager:
    """The updater of ``agent`` (its state under ``data_dir/ota``), wired to its parts."""
    config = agent.config
    return UpdateManager(
        Path(config.data_dir) / "ota",
        device_id=config.device_id,
        serving=agent.server,
        slots=agent.store,
        keyring=agent,
        profile_name=agent.profile.name,
        link=agent.link,
        events=agent.events,
        max_inbound_bytes=config.mqtt.max_inbound_bytes,
        hooks=hooks,
        groups=tuple(config.mqtt.groups),
        clock_skew_s=config.ota.clock_skew_s,
        max_command_validity_s=config.ota.max_command_validity_s,
        gate=gate,
        **transfer_settings(config),
    )
