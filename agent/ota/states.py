"""The update state machine as data: states, events, ONE transition table, ONE resume table.

Read the tables, not the code, to know what the updater does. A state's *work* is done while
the machine is in it (DOWNLOADING fetches, VERIFYING verifies and smoke-tests, STAGED writes the
bundle into the inactive slot, ACTIVATING switches slots and serving, PROBATION watches health,
ROLLING_BACK restores the old slot; the table of that work, ``WORK``, sits beside the steps in
:mod:`edgesdk.agent.ota.machine`). The state is persisted before that work starts, so after a
power loss the resume table knows exactly which work may have been half done.
"""

from __future__ import annotations

from enum import Enum

from edgesdk.protocol.ota import UpdateState


class UpdateEvent(str, Enum):
    """What a state's work (or the outside world) reports."""

    DEPLOYMENT = "deployment"  # a new, signed, acceptable deployment arrived
    DOWNLOADED = "downloaded"  # the whole bundle is on disk and matches the signed sha256
    VERIFIED = "verified"  # signature, hashes, anti-rollback, target and smoke test passed
    STAGED = "staged"  # written into the inactive slot, re-verified there
    ACTIVATED = "activated"  # slot switched and serving swapped
    HEALTHY = "healthy"  # probation window passed
    UNHEALTHY = "unhealthy"  # probation criteria breached (or crash loop)
    ROLLED_BACK = "rolled_back"  # old slot active and serving again
    ERROR = "error"  # the state's work failed
    CANCEL = "cancel"  # the operator cancelled (or asked for rollback)
    LOOP_DETECTED = "loop_detected"  # too many state saves in a row: fail safe


S, E = UpdateState, UpdateEvent

# fmt: off
#: (state, event) → next state. Anything not listed is refused (and logged), never guessed.
TRANSITIONS: dict[tuple[UpdateState, UpdateEvent], UpdateState] = {
    (S.IDLE,         E.DEPLOYMENT):    S.DOWNLOADING,
    (S.COMMITTED,    E.DEPLOYMENT):    S.DOWNLOADING,
    (S.ROLLED_BACK,  E.DEPLOYMENT):    S.DOWNLOADING,
    (S.FAILED,       E.DEPLOYMENT):    S.DOWNLOADING,

    (S.DOWNLOADING,  E.DOWNLOADED):    S.VERIFYING,
    (S.DOWNLOADING,  E.ERROR):         S.FAILED,
    (S.DOWNLOADING,  E.CANCEL):        S.FAILED,
    (S.DOWNLOADING,  E.LOOP_DETECTED): S.FAILED,

    (S.VERIFYING,    E.VERIFIED):      S.STAGED,
    (S.VERIFYING,    E.ERROR):         S.FAILED,
    (S.VERIFYING,    E.CANCEL):        S.FAILED,
    (S.VERIFYING,    E.LOOP_DETECTED): S.FAILED,

    (S.STAGED,       E.STAGED):        S.ACTIVATING,
    (S.STAGED,       E.ERROR):         S.FAILED,
    (S.STAGED,       E.CANCEL):        S.FAILED,
    (S.STAGED,       E.LOOP_DETECTED): S.FAILED,
    (S.STAGED,       E.UNHEALTHY):     S.FAILED,         # the shadow phase refused it: never activated

    (S.ACTIVATING,   E.ACTIVATED):     S.PROBATION,
    (S.ACTIVATING,   E.ERROR):         S.ROLLING_BACK,
    (S.ACTIVATING,   E.CANCEL):        S.ROLLING_BACK,
    (S.ACTIVATING,   E.LOOP_DETECTED): S.ROLLING_BACK,

    (S.PROBATION,    E.HEALTHY):       S.COMMITTED,
    (S.PROBATION,    E.UNHEALTHY):     S.ROLLING_BACK,
    (S.PROBATION,    E.ERROR):         S.ROLLING_BACK,
    (S.PROBATION,    E.CANCEL):        S.ROLLING_BACK,
    (S.PROBATION,    E.LOOP_DETECTED): S.ROLLING_BACK,

    (S.COMMITTED,    E.CANCEL):        S.ROLLING_BACK,   # operator rollback of a committed deployment

    (S.ROLLING_BACK, E.ROLLED_BACK):   S.ROLLED_BACK,
    (S.ROLLING_BACK, E.ERROR):         S.FAILED,
    (S.ROLLING_BACK, E.LOOP_DETECTED): S.FAILED,
}

#: Saved state found at start-up → state to continue in. Before activation nothing on the device
#: changed, so the work is simply redone; from activation on the default is to roll back, except
#: PROBATION, which continues with one more restart counted (a crash loop then rolls back).
RESUME: dict[UpdateState, UpdateState] = {
    S.IDLE:         S.IDLE,
    S.DOWNLOADING:  S.DOWNLOADING,    # the partial file is re-hashed chunk by chunk and continued
    S.VERIFYING:    S.VERIFYING,
    S.STAGED:       S.STAGED,
    S.ACTIVATING:   S.ROLLING_BACK,   # we cannot know how far the switch got
    S.PROBATION:    S.PROBATION,      # restart counted against health.max_restarts
    S.COMMITTED:    S.COMMITTED,      # commit is idempotent: finish it
    S.ROLLING_BACK: S.ROLLING_BACK,   # rollback is idempotent: finish it
    S.ROLLED_BACK:  S.ROLLED_BACK,
    S.FAILED:       S.FAILED,
}
# fmt: on

#: Nothing left to do; a new deployment may start from here.
RESTING_STATES = frozenset({S.IDLE, S.COMMITTED, S.ROLLED_BACK, S.FAILED})

#: States in which the new slot may be active but is not committed yet.
UNCOMMITTED_ACTIVE_STATES = frozenset({S.ACTIVATING, S.PROBATION})

#: Too many state saves for one deployment means something keeps looping (a crash in a state's
#: work that the resume table sends us back into): stop and fail safe instead of cycling forever.
MAX_STATE_SAVES = 40


def next_state(state: UpdateState, event: UpdateEvent) -> UpdateState | None:
    """The table's answer, or None when the event is not allowed in this state."""
    return TRANSITIONS.get((state, event))


def resume_state(saved: UpdateState) -> UpdateState:
    """Where to continue after a restart; anything unknown rolls back (the safe default)."""
    return RESUME.get(saved, S.ROLLING_BACK)
