"""The engine that walks the tables in :mod:`edgesdk.agent.ota.states`.

It knows nothing about MQTT, bundles or runtimes: each state's work is one method of an
:class:`UpdateTarget` (the real one drives the agent's SlotStore and ModelServer; unit tests
pass a fake), and :data:`WORK` — a table like the transition table — says which step does it,
which event its success reports and which events its failure may report. The loop is always
the same: persist the state, publish it, do its work, map the outcome to an event, look the
event up in the transition table.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, Protocol

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

    def shadow_phase(self, deployment: Deployment, slot: str, cancelled: Callable[[], bool]) -> str:
        """Run the staged model in ``slot`` beside the serving one on sampled live requests for
        ``deployment.health.shadow_s`` (called only when that is set); raise ProbationFailed on a
        refusal, with the old model still serving. Returns what passed."""
        ...

    def activate(self, deployment: Deployment, slot: str) -> None:
        """Make ``slot`` the active slot and swap serving to it (old slot kept)."""
        ...

    def probation(
        self, deployment: Deployment, started: datetime, restarts: int, cancelled: Callable[[], bool]
    ) -> str | None:
        """Watch health until the window ends; raise ProbationFailed on a breach. Returns what
        passed (the figures), or None."""
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
        # Test seam: called right after a state is persisted and before its work (power-loss injection).
        self.on_state_saved = on_state_saved
        self.max_state_saves = max_state_saves
        self.record = state_file.load()
        # Why the current state could not be persisted (disk full, read-only file system), or None.
        self._unsaved: str | None = None
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
            if self._unsaved is not None and state not in RESTING_STATES and state is not S.ROLLING_BACK:
                # A busy state that is not on disk must not do its work: after a crash the agent
                # would resume from the state before it (re-staging into a slot activated
                # meanwhile, say). Its failure path runs instead; rolling back always runs.
                event, reason = E.ERROR, self._unsaved
            elif state not in RESTING_STATES and self.record.save_count > self.max_state_saves:
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
        try:
            self.state_file.save(self.record)
            self._unsaved = None
        except OSError as exc:
            # Never an exception out of the loop: that would leave the machine "busy" in memory
            # until a restart. The loop sends a busy state down its failure path (see run).
            self._unsaved = f"cannot save update state {state.value}: {exc.strerror or exc}"
            log.error("%s (%s)", self._unsaved, self.state_file.path)
            if state not in RESTING_STATES:
                self._publish()
            return
        if self.on_state_saved is not None:
            self.on_state_saved(state)
        if state not in RESTING_STATES:
            self._publish()

    def _work(self, state: UpdateState) -> tuple[UpdateEvent | None, str]:
        """Run one state's work (its row of :data:`WORK`); map its outcome to (event, reason)."""
        try:
            if state in RESTING_STATES:
                self._rest(state)
                return None, ""
            deployment = self.record.deployment
            if deployment is None:
                # A busy state without a deployment can only come from a damaged record:
                # make sure the committed model serves, and stop.
                self.target.rollback(self.record.activated_slot)
                return E.ERROR, "update record lost its deployment"
            work = WORK.get(state)
            if work is None:  # pragma: no cover - a test checks every busy state has a row
                raise UpdateError(f"state {state.value} has no work defined")
            if E.CANCEL in work.failures:
                self._check_cancel()
            return work.done, work.step(self, deployment)
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

    # -- the steps of WORK: each does one busy state's work and returns the reason of its success --

    def _download(self, deployment: Deployment) -> str:
        path = self.target.download(deployment, self._progress, self._cancel.is_set)
        # Saved with the next state, before its work: a resume after a crash finds the file.
        self.record = self.record.model_copy(update={"download_path": path})
        return "bundle downloaded and its sha256 matches"

    def _verify(self, deployment: Deployment) -> str:
        self.target.verify(deployment, self._downloaded(deployment))
        return "signature, target, release and smoke test passed"

    def _stage(self, deployment: Deployment) -> str:
        slot = self.target.stage(deployment, self._downloaded(deployment))
        self.record = self.record.model_copy(update={"staged_slot": slot, "activated_slot": slot})
        staged = f"staged in slot {slot}"
        if not deployment.health.shadow_s:
            return staged
        # Before activation the staged model shadows the serving one (agent/shadow/phase.py);
        # a refusal (ProbationFailed) fails the update with the old model still serving.
        self._publish(reason=f"{staged}; shadow phase for {deployment.health.shadow_s:g} s before activation")
        summary = self.target.shadow_phase(deployment, slot, self._cancel.is_set)
        self._check_cancel()
        return f"{staged}; {summary}"

    def _activate(self, deployment: Deployment) -> str:
        slot = self.record.activated_slot
        if slot is None:
            raise UpdateError("no staged slot to activate")
        self.target.activate(deployment, slot)
        return f"slot {slot} active and serving"

    def _watch_probation(self, deployment: Deployment) -> str:
        if self.record.restarts > deployment.health.max_restarts:
            raise ProbationFailed(
                f"crash loop: {self.record.restarts} restarts in probation "
                f"(max_restarts {deployment.health.max_restarts})"
            )
        started = self.record.probation_started or _now()
        summary = self.target.probation(deployment, started, self.record.restarts, self._cancel.is_set)
        self._check_cancel()
        return summary or "probation passed"

    def _roll_back(self, deployment: Deployment) -> str:
        self.target.rollback(self.record.activated_slot)
        return self.record.reason or "rolled back"

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

    _cancel_reason = "cancelled by operator"

    def _downloaded(self, deployment: Deployment) -> Path:
        """The finished download the record names; when it is gone (or a record from before the
        path was saved), DOWNLOADING's work again: a quick re-check of a finished file, or a fetch."""
        saved = self.record.download_path
        if saved is not None and saved.is_file():
            return saved
        self._download(deployment)
        path = self.record.download_path
        if path is None:  # pragma: no cover - _download always records the path
            raise UpdateError(f"download of {deployment.deployment_id!r} left no file")
        return path

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


class StateWork(NamedTuple):
    """One row of :data:`WORK`."""

    #: Does the state's work (calling the UpdateTarget) and returns the reason of its success.
    step: Callable[[UpdateMachine, Deployment], str]
    #: The event its success reports.
    done: UpdateEvent
    #: The events its failure may report: ERROR for any error, CANCEL when the operator may stop
    #: it (checked before the step starts), UNHEALTHY for a breached health criterion.
    failures: frozenset[UpdateEvent]


_STOPPABLE = frozenset({E.ERROR, E.CANCEL})

# fmt: off
#: Busy state → its work. Resting states have none (they finish idempotent work in ``_rest``).
WORK: dict[UpdateState, StateWork] = {
    S.DOWNLOADING:  StateWork(UpdateMachine._download,         E.DOWNLOADED,  _STOPPABLE),
    S.VERIFYING:    StateWork(UpdateMachine._verify,           E.VERIFIED,    _STOPPABLE),
    S.STAGED:       StateWork(UpdateMachine._stage,            E.STAGED,      _STOPPABLE | {E.UNHEALTHY}),
    S.ACTIVATING:   StateWork(UpdateMachine._activate,         E.ACTIVATED,   _STOPPABLE),
    S.PROBATION:    StateWork(UpdateMachine._watch_probation,  E.HEALTHY,     _STOPPABLE | {E.UNHEALTHY}),
    S.ROLLING_BACK: StateWork(UpdateMachine._roll_back,        E.ROLLED_BACK, frozenset({E.ERROR})),
}
# fmt: on
