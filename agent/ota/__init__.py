"""Over-the-air model updates on the device: a persisted state machine (Mender style) that
downloads, verifies, stages, smoke-tests, activates, watches and commits or rolls back a bundle.

Public surface: :class:`UpdateManager` (what the agent uses), the state/event enums and tables.
"""

from edgesdk.agent.ota.boot import guard_boot
from edgesdk.agent.ota.machine import UpdateMachine, UpdateTarget
from edgesdk.agent.ota.manager import UpdateManager
from edgesdk.agent.ota.states import RESUME, TRANSITIONS, UpdateEvent, UpdateState

from edgesdk.protocol.signing import sign_deployment, verify_deployment

__all__ = [
    "RESUME",
    "TRANSITIONS",
    "UpdateEvent",
    "UpdateMachine",
    "UpdateManager",
    "UpdateState",
    "UpdateTarget",
    "guard_boot",
    "sign_deployment",
    "verify_deployment",
]
