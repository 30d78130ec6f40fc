"""The OTA states as both sides name them on the wire.

The device's update machine (``edgesdk.agent.ota.states``) walks these states; every change is
published as ``OtaStatus.state`` and the fleet's rollout reads it back. The enum is the one
list: ``edgesdk.schemas.messages.OtaState`` is derived from it, so the JSON Schema and the
machine cannot drift apart.
"""

from __future__ import annotations

from enum import Enum


class UpdateState(str, Enum):
    """Where an update is. Values are the wire names of ``schemas.messages.OtaState``."""

    IDLE = "IDLE"
    DOWNLOADING = "DOWNLOADING"
    VERIFYING = "VERIFYING"
    STAGED = "STAGED"
    ACTIVATING = "ACTIVATING"
    PROBATION = "PROBATION"
    COMMITTED = "COMMITTED"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"
    FAILED = "FAILED"


#: The wire names, in the enum's order (what ``OtaState`` accepts).
OTA_STATE_NAMES: tuple[str, ...] = tuple(state.value for state in UpdateState)
