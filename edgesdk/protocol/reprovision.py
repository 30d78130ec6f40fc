"""The re-provision command: an operator tells one tampered device to start a fresh security state.

A device whose security state record is missing or invalid (agent/security_state.py) refuses
installs and commands. ``edgesdk fleet reprovision DEVICE`` publishes this command on the
device's ``ota/reprovision`` topic; the device checks it exactly as it checks a deployment
(Ed25519 by an operator key over the canonical JSON without ``signature``, addressed to it,
issued and expiring within the clock skew, valid for at most ``[ota] max_command_validity_s``,
a sequence not ahead of its clock) and also that it names the device's own key id. It then
writes a new record at the floors the command states: every named model's release floor, the
trust document the command carries (checked against the device's root), and every operator
key's sequence at this command's, so no command issued before it is accepted again.

The fields mirror :class:`~edgesdk.schemas.messages.Deployment`'s (``deployment_id``,
``issued_at``, ``expires_at``, ``sequence``, ``targets``, ``action``, ``signature``) so the
same signing code (``edgesdk.protocol.signing``) and the device's command gate apply unchanged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from edgesdk.schemas.base import Schema

#: The suffix under the device's topic (``{namespace}/devices/{id}/ota/reprovision``).
REPROVISION: Literal["ota/reprovision"] = "ota/reprovision"
_KEY_ID = r"^[0-9a-f]{32}$"


class Reprovision(Schema):
    """Start a fresh security state on one device, at the floors stated here."""

    schema_version: Literal[2] = 2
    kind: Literal["reprovision"] = "reprovision"
    action: Literal["reprovision"] = "reprovision"
    deployment_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="names this command in events and logs"
    )
    issued_at: datetime
    expires_at: datetime
    sequence: int = Field(ge=0, description="as a deployment's: strictly increasing per signing key")
    targets: list[str] = Field(min_length=1, max_length=1, description="the one device re-provisioned")
    target_groups: list[str] = Field(default_factory=list, max_length=0, description="never a group")
    key_id: str = Field(pattern=_KEY_ID, description="the device key id (edge-agent key) it is for")
    release_floors: dict[str, int] = Field(
        default_factory=dict, description="model name → release floor of the new record (at least these)"
    )
    trust_document: str | None = Field(
        None, max_length=256 * 1024, description="the fleet's trust document in force (its JSON text)"
    )
    signature: str | None = Field(None, description="Ed25519 over the canonical JSON without this field")

    @model_validator(mode="after")
    def _bounded(self) -> Reprovision:
        if self.expires_at <= self.issued_at:
            raise ValueError(f"expires_at {self.expires_at.isoformat()} is not after issued_at")
        bad = {name: floor for name, floor in self.release_floors.items() if not 0 <= floor < 2**31}
        if bad:
            raise ValueError(f"release floors out of range: {bad}")
        return self


def sign_reprovision(command: Reprovision, private_key: Any) -> Reprovision:
    """A copy of ``command`` signed by the operator (the deployment signing, unchanged)."""
    from edgesdk.protocol.signing import sign_deployment

    # The same fields are signed the same way; the function is typed for its first user.
    return sign_deployment(command, private_key)  # type: ignore[arg-type,return-value]
