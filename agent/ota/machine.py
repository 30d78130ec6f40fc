"""The engine that walks the tables in :mod:`edgesdk.agent.ota.states`.

It knows nothing about MQTT, bundles or runtimes: each state's work is one method of an
:class:`UpdateTarget` (the real one drives the agent's ModelStore and ModelServer; unit tests
pass a fake). The loop is always the same: persist the state, publish it, do its work, map the
outcome to an event, look the event up in the transition table.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from edgesdk.agent.ota.record import StateFile, UpdateRecord
from edgesdk.agent.ota.states import (
    MAX_STATE_SAVES,
    RESTING_STATES,
    UpdateEvent,
    UpdateState,
    next_state,
    resume_state,
)

from edgesdk.errors import EdgeSDKError, UpdateError
from edgesdk.schemas.messages import Deployment, OtaStatus, RunningModel

log = logging.getLogger(__name__)

S, E = UpdateState, UpdateEvent


class UpdateCancelled(UpdateError):
    """The operator cancelled the deployment while its work was running."""


class ProbationFailed(UpdateError):
    """The new model breached a health criterion of its deployment during probation."""


class UpdateTarget(Protocol):
    """The device-side work of each state. Every method may raise; errors become events."""

    def download(
        self, deployment: Deployment, progress: Callable[[float], None], cancelled: Callable[[], bool]
    ) -> Path:
        """Fetch the bundle (resuming a partial download) and return its path."""
        ...

    def verify(self, deployment: Deployment, path: Path) -> None:
        """Signature, hashes, anti-rollback, target profile, then the smoke test. Raises on failure."""
        ...

    def stage(self, deployment: Deployment, path: Path) -> str:
        """Write the bundle into the inactive slot, re-verify it there; return the slot name."""
        ...

    def activate(self, deployment: Deployment, slot: str) -> None:
        """Make ``slot`` the active slot and swap serving to it (old slot kept)."""
        ...

    def probation(
        self, deployment: Deployment, started: datetime, restarts: int, cancelled: Callable[[], bool]
    ) -> None:
        """Watch health until the window ends; raise ProbationFailed on a breach."""
        ...

    def commit(self, deployment: Deployment) -> None:
        """Mark the active slot good; the old slot may now be reused."""
        ...

    def rollback(self, activated_slot: str | None) -> None:
        """Make the old slot active and serve it again. Idempotent: a second call changes nothing."""
        ...

    def discard(self, deployment: Deployment | None) -> None:
        """Drop download leftovers of a finished deployment (never a slot that serves)."""
        ...

    def running_model(self) -> RunningModel | None:
        """What is serving right now — reported with every status, so reports tell the truth."""
        ...

    def publish(self, status: OtaStatus) -> None:
        """Send a status change (QoS 1, store-and-forward). Must not raise."""
        ...


def _now() -> datetime:
    return datetime.now(timezone.utc)


class UpdateMachine:
    """Runs one deployment at a time through the state tables, persisting before each state's work."""

    def __init__(
        self,
        target: UpdateTarget,
        state_file: StateFile,
        *,
        device_id: str,
        on_state_saved: Callable[[UpdateState], None] | None = None,
        max_state_saves: int = MAX_STATE_SAVES,
    ) -> None:
        self.target = target
        self.state_file = state_file
        self.device_id = device_id
        # Test hook: called right after a state is persisted and before its work (fault injection).
        self.on_state_saved = on_state_saved
        self.max_state_saves = max_state_saves
        self.record = state_file.load()
        self._cancel = threading.Event()
        self._lock = threading.RLock()

    # -- public API -------------------------------------------------------------------------------

    @property
    def state(self) -> UpdateState:
        return self.record.state

    @property
    def busy(self) -> bool:
        return self.record.state not in RESTING_STATES

    def resume(self) -> UpdateState:
        """After a restart: continue where the resume table says, until a resting state."""
        saved = self.record.state
        target = resume_state(saved)
        # guard_boot (called before the model loaded) may already have counted this start.
        counted = self.record.boot_counted
        restarts = self.record.restarts + (1 if saved is S.PROBATION and not counted else 0)
        if counted:
            self.record = self.record.model_copy(update={"boot_counted": False})
        if saved in RESTING_STATES:
            # Nothing half done: finish the idempotent resting work and report the truth again.
            return self.run()
        log.info("resuming update %s: saved state %s → %s", self._deployment_id(), saved.value, target.value)
        reason = self.record.reason if target is saved else f"agent restarted during {saved.value}"
        if self.record.save_count >= self.max_state_saves:
            # Each restart re-saves a state; this many means we keep dying in the same work.
            target = next_state(target, E.LOOP_DETECTED) or S.ROLLING_BACK
            reason = f"update loop detected after {self.record.save_count} state saves (last {saved.value})"
        self._enter(target, reason=reason, restarts=restarts)
        return self.run()

    def start(self, deployment: Deployment) -> UpdateState:
        """Begin ``deployment`` (already signature-checked by the caller) and run it to rest."""
        with self._lock:
            if self.busy:
                raise UpdateError(
                    f"deployment {deployment.deployment_id!r} refused: {self._deployment_id()!r} is "
                    f"{self.record.state.value}; cancel it first or retry when it finishes"
                )
            nxt = next_state(self.record.state, E.DEPLOYMENT)
            if nxt is None:  # pragma: no cover - every resting state accepts a deployment
                raise UpdateError(f"deployment refused in state {self.record.state.value}")
            self._cancel.clear()
            self.record = UpdateRecord(state=self.record.state, deployment=deployment)
            self._enter(nxt, reason="deployment received", save_count=0)
        return self.run()

    def cancel(self, reason: str = "cancelled by operator") -> None:
        """Ask the running work to stop; it ends in FAILED (before activation) or ROLLED_BACK."""
        self._cancel_reason = reason
        self._cancel.set()

    def rollback_committed(self, reason: str = "rollback requested by operator") -> UpdateState:
        """Operator rollback of a deployment that already committed."""
        with self._lock:
            nxt = next_state(self.record.state, E.CANCEL)
            if self.record.state is not S.COMMITTED or nxt is None:
                raise UpdateError(f"nothing to roll back: update state is {self.record.state.value}")
            self._enter(nxt, reason=reason)
        return self.run()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> UpdateState:
        """Do the current state's work, follow the table, repeat until a resting state."""
        while True:
            state = self.record.state
            if state not in RESTING_STATES and self.record.save_count > self.max_state_saves:
                event, reason = E.LOOP_DETECTED, f"update loop detected after {self.record.save_count} state saves"
            else:
                event, reason = self._work(state)
            if event is None:
                return state
            nxt = next_state(state, event)
            if nxt is None:
                # Not in the table: refuse to guess. Stay put, report why.
                log.error("no transition from %s on %s; staying", state.value, event.value)
                self._publish(reason=f"ignored {event.value} in {state.value}: {reason}")
                return state
            self._enter(nxt, reason=reason)

    def _enter(
        self, state: UpdateState, *, reason: str, save_count: int | None = None, restarts: int | None = None
    ) -> None:
        """Persist ``state`` (before its work), then publish it."""
        now = _now()
        previous_saves = self.record.save_count if save_count is None else save_count
        update: dict[str, object] = {"state": state, "reason": reason, "updated": now, "save_count": previous_saves + 1}
        if restarts is not None:
            update["restarts"] = restarts
        if state is S.PROBATION and self.record.probation_started is None:
            update["probation_started"] = now
        self.record = self.record.model_copy(update=update)
        self.state_file.save(self.record)
        if self.on_state_saved is not None:
            self.on_state_saved(state)
        if state not in RESTING_STATES:
            self._publish()

    def _work(self, state: UpdateState) -> tuple[UpdateEvent | None, str]:
        """Run one state's work; map its outcome to (event, reason)."""
        deployment = self.record.deployment
        try:
            if state in RESTING_STATES:
                self._rest(state)
                return None, ""
            if deployment is None:
                # A busy state without a deployment can only come from a damaged record:
                # make sure the committed model serves, and stop.
                self.target.rollback(self.record.activated_slot)
                return E.ERROR, "update record lost its deployment"
            if next_state(state, E.CANCEL) is not None:
                self._check_cancel()
            if state is S.DOWNLOADING:
                path = self.target.download(deployment, self._progress, self._cancel.is_set)
                self._download_path = path
                return E.DOWNLOADED, "bundle downloaded and its sha256 matches"
            if state is S.VERIFYING:
                self.target.verify(deployment, self._downloaded(deployment))
                return E.VERIFIED, "signature, target, release and smoke test passed"
            if state is S.STAGED:
                slot = self.target.stage(deployment, self._downloaded(deployment))
                self.record = self.record.model_copy(update={"staged_slot": slot, "activated_slot": slot})
                return E.STAGED, f"staged in slot {slot}"
            if state is S.ACTIVATING:
                slot = self.record.activated_slot
                if slot is None:
                    return E.ERROR, "no staged slot to activate"
                self.target.activate(deployment, slot)
                return E.ACTIVATED, f"slot {slot} active and serving"
            if state is S.PROBATION:
                started = self.record.probation_started or _now()
                if self.record.restarts > deployment.health.max_restarts:
                    return E.UNHEALTHY, (
                        f"crash loop: {self.record.restarts} restarts in probation "
                        f"(max_restarts {deployment.health.max_restarts})"
                    )
                self.target.probation(deployment, started, self.record.restarts, self._cancel.is_set)
                self._check_cancel()
                return E.HEALTHY, "probation passed"
            if state is S.ROLLING_BACK:
                self.target.rollback(self.record.activated_slot)
                return E.ROLLED_BACK, self.record.reason or "rolled back"
        except UpdateCancelled as exc:
            self._cancel.clear()
            return E.CANCEL, str(exc)
        except ProbationFailed as exc:
            return E.UNHEALTHY, str(exc)
        except EdgeSDKError as exc:
            return E.ERROR, f"{state.value.lower()} failed: {exc}"
        except OSError as exc:
            return E.ERROR, f"{state.value.lower()} failed: {exc.strerror or exc}"
        except Exception as exc:  # noqa: BLE001 - a bug in one state must end in a safe state, not a dead agent
            log.exception("unexpected error in %s", state.value)
            return E.ERROR, f"{state.value.lower()} failed unexpectedly: {type(exc).__name__}: {exc}"
        raise UpdateError(f"state {state.value} has no work defined")  # pragma: no cover

    def _rest(self, state: UpdateState) -> None:
        """Resting states finish idempotent work (commit, cleanup), then report once."""
        deployment = self.record.deployment
        if state is S.COMMITTED and deployment is not None:
            self.target.commit(deployment)
        if state in (S.COMMITTED, S.ROLLED_BACK, S.FAILED):
            self.target.discard(deployment)
        if state is not S.IDLE:
            self._publish()

    # -- helpers ----------------------------------------------------------------------------------

    _download_path: Path | None = None
    _cancel_reason = "cancelled by operator"

    def _downloaded(self, deployment: Deployment) -> Path:
        if self._download_path is None:
            # After a restart the work of DOWNLOADING is a quick re-check of the finished file.
            self._download_path = self.target.download(deployment, self._progress, self._cancel.is_set)
        return self._download_path

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise UpdateCancelled(self._cancel_reason)

    def _progress(self, fraction: float) -> None:
        self._publish(progress=fraction)

    def _deployment_id(self) -> str:
        return self.record.deployment.deployment_id if self.record.deployment else "-"

    def _publish(self, *, reason: str | None = None, progress: float | None = None) -> None:
        try:
            running = self.target.running_model()
        except Exception:  # noqa: BLE001 - reporting must never break the update
            log.exception("status for %s goes out without the running model", self._deployment_id())
            running = None
        status = OtaStatus(
            device_id=self.device_id,
            deployment_id=self._deployment_id(),
            msg_id=uuid.uuid4().hex,
            ts=_now(),
            state=self.record.state.value,
            reason=self.record.reason if reason is None else reason,
            progress=progress,
            model=running,
        )
        try:
            self.target.publish(status)
        except Exception:  # noqa: BLE001 - a dead link must not stop an update; the queue retries
            log.exception("could not publish update status")
