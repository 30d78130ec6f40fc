"""The device's identity at start: its key (made on the first start when none is configured)
and the security state record made with it.

The record (agent/security_state.py) is made with the key and never later (strict rule), so a
missing or invalid record means tampering: it is then kept open with its ``problem`` set, and
installs, commands and trust updates are refused until an operator re-provisions the device.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.errors import EdgeSDKError
from edgesdk.schemas.agent_config import AgentConfig

if TYPE_CHECKING:  # the security state loads the key code; imported when the agent starts it
    from edgesdk.agent.security_state import SecurityState

log = logging.getLogger("edgesdk.agent")


def find_or_make_device_key(config: AgentConfig, data_dir: Path) -> tuple[Path, bool]:
    """The device key's path and whether it was made just now (first start, none configured)."""
    if config.device_key is not None:
        return Path(config.device_key), False  # configured: must exist (checked with the other key files)
    default = data_dir / "device.key"
    if default.exists():
        return default, False
    from edgesdk import keys  # first start only: the crypto library is needed to make a key

    priv, pub = keys.generate_device_key(data_dir)
    log.info("created device key %s (public key %s)", priv, pub)
    return default, True


def open_security_state(data_dir: Path, key_path: Path, *, unseal: str, made_key: bool) -> SecurityState:
    """The record, opened (created first with a key made just now); ``problem`` says why it is
    not trusted when it cannot be: the device then fails closed."""
    from edgesdk.agent.security_state import SecurityState, state_key_provider

    state = SecurityState(data_dir, state_key_provider(key_path, unseal=unseal))
    try:
        if made_key:  # the record is made with the key, never later (strict rule)
            state.create()
        state.open()
    except EdgeSDKError as exc:  # the key cannot be derived (a bad key file): fail closed, say why
        state.problem = f"security state: {exc}"
    return state
