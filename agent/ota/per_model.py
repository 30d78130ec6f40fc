"""Deployments routed to the updater of the model they name.

Each installed model has its own :class:`~edgesdk.agent.ota.manager.UpdateManager` (its own
state machine, record and downloads under ``models/<name>/ota``; one command gate shared by all,
so the operator's sequence stays one per device). :class:`ModelUpdates` holds the link's
deployment and chunk subscriptions and hands each deployment to the updater of its
``model_name``. A deployment for a model the device does not have yet makes its store and
updater only once its signature checked: nobody but an operator can make the device create
a model directory.

Updates of different models run one after another (the updaters share one turn lock, see
docs/ota.md "Several models on one device"): a second model's update waits until the first
committed or rolled back, so the memory budget is checked against what is really resident,
and one probation's health figures are never another model's switch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from edgesdk.agent.ota.freshness import ReportBudget
from edgesdk.agent.ports import EventSink, UpdateChannel

from edgesdk.errors import EdgeSDKError
from edgesdk.protocol.signing import SignatureProblem, Unverified, check_deployment, command_digest
from edgesdk.protocol.topics import OTA_CHUNK_DATA, OTA_DEPLOYMENT
from edgesdk.schemas.messages import CommandRefusal, Deployment

log = logging.getLogger(__name__)


class ModelUpdates:
    """The link's OTA topics, routed to each model's updater."""

    def __init__(
        self,
        link: UpdateChannel,
        *,
        updater_for: Callable[[str], Any],
        known: Callable[[str], bool],
        default_name: Callable[[], str | None],
        trusted_operators: Callable[[], list[Any]],
        started: Callable[[], list[Any]],
        events: EventSink | None = None,
    ) -> None:
        self._updater_for = updater_for  # name → that model's UpdateManager (made on first use)
        self._known = known
        self._default_name = default_name
        self._trusted_operators = trusted_operators
        self._started = started  # the updaters made so far
        self._events = events
        self._unverified_reports = ReportBudget()
        link.subscribe(OTA_DEPLOYMENT, self.handle_deployment)
        link.subscribe(OTA_CHUNK_DATA, self.on_chunk_frame)

    def handle_deployment(self, payload: bytes) -> None:
        """A message on ``ota/deployment``: to the updater of its model. Never raises for bad input."""
        try:
            deployment = Deployment.parse_json_clear(payload, source="deployment message")
        except EdgeSDKError as exc:
            self._to_default(payload, "malformed", str(exc))  # it refuses and reports the message, as before
            return
        name = deployment.model_name
        if not self._known(name):
            try:
                checked = check_deployment(deployment, self._trusted_operators())
            except EdgeSDKError as exc:  # no operator key may sign
                checked = Unverified("unknown_key", str(exc))
            if isinstance(checked, Unverified):
                self._to_default(payload, checked.why, checked.message)  # refused before any directory exists
                return
        try:
            updater = self._updater_for(name)
        except EdgeSDKError as exc:  # e.g. a model name no directory may carry
            log.warning("refused deployment %s: %s", deployment.deployment_id, exc)
            default = self._default_name()
            if default is not None:
                self._updater_for(default).refuse(deployment, str(exc), command_sha256=command_digest(payload))
            return
        updater.handle_deployment(payload)

    def _to_default(self, payload: bytes, why: SignatureProblem | Literal["malformed"], problem: str) -> None:
        name = self._default_name()
        if name is not None:
            self._updater_for(name).handle_deployment(payload)
            return
        # No model yet, so no updater: the same rate-limited event the updater would send.
        log.warning("ignored deployment message: %s", problem)
        if self._events is not None and self._unverified_reports.take():
            refusal = CommandRefusal(command_sha256=command_digest(payload), why=why, reason=problem[:1024])
            self._events.emit("ota_refused", refusal.model_dump())

    def on_chunk_frame(self, payload: bytes) -> None:
        """``ota/chunks/data``: every updater's download takes the frames of its own deployment."""
        for updater in self._started():
            try:
                updater.target.on_chunk_frame(payload)
            except EdgeSDKError as exc:
                log.warning("bad OTA chunk frame: %s", exc)
                return
