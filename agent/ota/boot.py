"""The boot guard: what must happen before the agent loads any model.

A new model that crashes the agent while it loads (a runtime segfault, an out-of-memory kill)
would crash-loop the device before the update manager ever resumes. So the daemon calls
:func:`guard_boot` first: a start in PROBATION counts as a restart, and once the deployment's
``max_restarts`` is exceeded — or when the saved state is ACTIVATING, which resumes as a
rollback anyway — the store is switched back to the old slot *before* anything loads the new
one. The update manager then finishes the rollback (idempotently) and reports it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgesdk.agent.ota.record import StateFile
from edgesdk.agent.ota.states import UpdateState

log = logging.getLogger(__name__)


def guard_boot(data_dir: Path, store: Any) -> str | None:
    """Run before the agent loads its model; returns what it did (for the log), or None."""
    state_file = StateFile(Path(data_dir) / "ota" / "state.json")
    if not state_file.path.exists():
        return None
    record = state_file.load()
    deployment = record.deployment
    if deployment is None or record.state not in (UpdateState.PROBATION, UpdateState.ACTIVATING):
        return None
    reason: str | None = None
    if record.state is UpdateState.ACTIVATING:
        reason = "agent restarted during ACTIVATING"
    else:
        restarts = record.restarts + 1  # every start counts; resume then skips its own count
        record = record.model_copy(update={"restarts": restarts, "boot_counted": True})
        if restarts > deployment.health.max_restarts:
            reason = f"crash loop: {restarts} restarts in probation (max_restarts {deployment.health.max_restarts})"
    if reason is not None:
        store.reload()
        if record.activated_slot is not None and store.active_slot == record.activated_slot:
            store.rollback()  # before anything loads the new slot again
        record = record.model_copy(
            update={"state": UpdateState.ROLLING_BACK, "reason": reason, "updated": datetime.now(timezone.utc)}
        )
        log.warning("boot guard: %s; back to slot %s before loading", reason, store.active_slot)
    state_file.save(record)
    return reason
