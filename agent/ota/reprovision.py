"""The device side of the operator-signed re-provision command (``edgesdk.protocol.reprovision``).

A tampered device cannot read its own record, so it cannot know which trust document is in
force: it checks the command's signature with the operator keys of the trust document the
command carries (which must chain from the image's root and be newer than or the image's
document) or, when the command carries none, of the image's document; without trust
documents, with the configured keys. The freshness checks are the command gate's
(``agent/ota/freshness.py``); the replay check uses the record's ledger when the record is
still valid, and nothing when it is not (the new record then sets every operator key's
sequence to this command's, so nothing issued before it is accepted again).

Refusals are events (``reprovision_refused``; an unsigned or unverifiable message only within
the same rate limit as a deployment's), never an ``ota/status``: the command has no deployment.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.agent.ota.freshness import Admission, CommandGate, CommandRefused, ReportBudget, SequenceLedger
from edgesdk.agent.security_state import LedgerEntry, RecordLedgerStore, SecurityRecord, SecurityState

from edgesdk.errors import EdgeSDKError
from edgesdk.protocol.reprovision import Reprovision
from edgesdk.protocol.signing import Unverified, check_deployment, command_digest

log = logging.getLogger(__name__)


class _NoLedger:
    """The ledger of a device whose record is gone: nothing accepted yet (the gate's other checks hold)."""

    def load(self) -> dict[str, tuple[int, str]]:
        return {}

    def save(self, entries: dict[str, tuple[int, str]]) -> None:
        pass  # the new record writes the ledger


class Reprovisioner:
    """Handles ``ota/reprovision`` for one device (wired by the daemon when MQTT is on)."""

    def __init__(
        self,
        *,
        device_id: str,
        security: SecurityState,
        key_id: Callable[[], str],
        operator_keys: Callable[[Reprovision], list[Any]],
        gate_settings: dict[str, Any],
        events: Any,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        self.device_id = device_id
        self.security = security
        self._key_id = key_id
        self._operator_keys = operator_keys  # command → the keys that may sign it (TrustError: none)
        self._gate_settings = gate_settings
        self._events = events
        self._on_done = on_done
        self._unverified_reports = ReportBudget()

    def handle(self, payload: bytes) -> None:
        """A message on ``ota/reprovision``. Never raises for bad input."""
        digest = command_digest(payload)
        try:
            command = Reprovision.parse_json_clear(payload, source="re-provision message")
        except EdgeSDKError as exc:
            self._unverified({"command_sha256": digest, "why": "malformed", "reason": str(exc)[:1024]})
            return
        try:
            keys = self._operator_keys(command)
        except EdgeSDKError as exc:  # the carried document is not the root's, or the one in force expired
            self._unverified({"command_sha256": digest, "why": "trust_document", "reason": str(exc)[:1024]})
            return
        signer = check_deployment(command, keys)  # type: ignore[arg-type]
        if isinstance(signer, Unverified):
            self._unverified({"command_sha256": digest, "why": signer.why, "reason": signer.message[:1024]})
            return
        try:
            admission, current = self._admit(command, signer)
            if admission is Admission.REPEAT:
                return  # the same command again (QoS 1 redelivery): it was done, floors may have risen since
            record = self._new_record(command, signer, keys, current)
            self.security.seed(record, replace_valid=True)
        except (CommandRefused, EdgeSDKError) as exc:
            why = getattr(exc, "why", "refused")
            log.warning("refused re-provision %s (%s): %s", command.deployment_id, why, exc)
            self._emit("reprovision_refused", {"command_sha256": digest, "why": why, "reason": str(exc)[:1024]})
            return
        log.warning(
            "security state re-provisioned by %s (operator key %s): release floors %s, trust document %s",
            command.deployment_id,
            signer,
            record.release_floors or "none",
            f"version {record.trust_version}" if record.trust_version is not None else "of the image",
        )
        self._on_done()
        self._emit(
            "security_state_reprovisioned",
            {"deployment_id": command.deployment_id, "command_sha256": digest, "trust_version": record.trust_version},
        )

    def _admit(self, command: Reprovision, signer: str) -> tuple[Admission, SecurityRecord | None]:
        """The deployment gate's checks; the replay check against the record when it is valid
        (returned too: a healthy device's floors are never lowered by a re-provision)."""
        if command.key_id != self._key_id():
            raise CommandRefused(
                "not_addressed",
                f"re-provision {command.deployment_id!r} is for device key {command.key_id}, not this one",
            )
        current: SecurityRecord | None
        try:
            current = self.security.read()
            store: Any = RecordLedgerStore(self.security)
        except EdgeSDKError:
            current, store = None, _NoLedger()
        gate = CommandGate(
            SequenceLedger(Path("/nonexistent"), store=store), device_id=self.device_id, **self._gate_settings
        )
        return gate.admit(command, signer), current  # type: ignore[arg-type]

    @staticmethod
    def _new_record(
        command: Reprovision, signer: str, keys: list[Any], current: SecurityRecord | None
    ) -> SecurityRecord:
        from edgesdk.keys import key_id

        digest = hashlib.sha256((command.signature or "").encode()).hexdigest()
        ledger = {key_id(key): LedgerEntry(sequence=command.sequence, digest=digest) for key in keys}
        ledger[signer] = LedgerEntry(sequence=command.sequence, digest=digest)
        trust_version = None
        if command.trust_document is not None:
            from edgesdk.trust.document import parse_document

            trust_version = parse_document(command.trust_document.encode(), source="re-provision").version
        floors = dict(command.release_floors)
        trust_document = command.trust_document
        if current is not None:  # a valid record: nothing it holds is lowered
            for model, floor in current.release_floors.items():
                floors[model] = max(floor, floors.get(model, 0))
            if current.trust_version is not None and (trust_version or 0) < current.trust_version:
                trust_document, trust_version = current.trust_document, current.trust_version
        return SecurityRecord(
            trust_document=trust_document,
            trust_version=trust_version,
            release_floors=floors,
            ledger=ledger,
        )

    def _unverified(self, detail: dict[str, Any]) -> None:
        if self._unverified_reports.take():
            log.warning(
                "refused re-provision message %s (%s): %s",
                detail["command_sha256"][:12],
                detail["why"],
                detail["reason"],
            )
            self._emit("reprovision_refused", detail)

    def _emit(self, name: str, detail: dict[str, Any]) -> None:
        if self._events is not None:
            self._events.emit(name, detail)


def trust_keys(shipped: Path | None, configured: Callable[[], list[Any]]) -> Callable[[Reprovision], list[Any]]:
    """The operator keys that may sign a re-provision: from the command's trust document, which
    must chain from the image's (``shipped``), or from the image's; without a trust document
    configured, the configured keys."""

    def keys(command: Reprovision) -> list[Any]:
        if shipped is None:
            return list(configured())
        from edgesdk.trust.document import (
            load_document,
            parse_document,
            require_current,
            role_keys,
            verify_self,
            verify_update,
        )

        image = load_document(shipped)
        verify_self(image)
        document = image
        if command.trust_document is not None:
            carried = parse_document(command.trust_document.encode(), source="the re-provision's trust document")
            if carried != image:
                verify_update(image, carried)  # root-signed, newer than the image's, not expired
            document = carried
        require_current(document)
        return role_keys(document.roles.operator)

    return keys


def attach(agent: Any) -> Reprovisioner:
    """Subscribe a re-provisioner for ``agent`` (the daemon) on its link's ``ota/reprovision``."""
    from edgesdk.agent.keyring import raw_key_id

    from edgesdk.protocol.reprovision import REPROVISION

    config = agent.config

    def done() -> None:  # the record is valid again: the trust document and /v1/status follow it
        if agent.trust is not None:
            agent.trust.reload()
        agent.problems[:] = [p for p in agent.problems if not p.startswith("security state")]

    reprovisioner = Reprovisioner(
        device_id=config.device_id,
        security=agent.security,
        key_id=lambda: raw_key_id(agent.keyring.device_public_key()),
        operator_keys=trust_keys(
            Path(config.trust_document) if config.trust_document is not None else None,
            lambda: agent.keyring.trusted_operators,
        ),
        gate_settings={"clock_skew_s": config.ota.clock_skew_s, "max_validity_s": config.ota.max_command_validity_s},
        events=agent.events,
        on_done=done,
    )
    agent.link.subscribe(REPROVISION, reprovisioner.handle)
    return reprovisioner
