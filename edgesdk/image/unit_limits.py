"""The per-device part of the agent's systemd unit: a drop-in with resource and network limits.

The unit itself (``firmware_images/<family>/overlay/etc/systemd/system/edge-agent.service``)
is the same on every device of a family; what depends on the device profile and the broker is
rendered here into ``edge-agent.service.d/limits.conf``, which systemd merges into the unit.

How the values are derived (``docs/security.md`` and ``firmware_images/README.md`` say why):

- ``MemoryMax``: twice the profile's ``model_ram_budget_mb`` (during an update's probation the
  previous model stays loaded next to the new one, so rollback is a pointer switch) plus
  :data:`AGENT_BASE_MB` for the interpreter, the runtimes' own code and buffers, capped at
  :data:`MAX_RAM_SHARE` of the board's RAM so the OS and sshd survive a runaway request.
  ``MemoryHigh`` at 90 % of it makes the kernel reclaim (and the agent slow down) before the
  OOM kill. ``MemorySwapMax=0``: decrypted models must not be paged out to a persistent disk.
- ``TasksMax``: :data:`TASKS_BASE` (event loop, HTTP, MQTT, updater, governor, unseal helper)
  plus :data:`TASKS_PER_CORE` per CPU core (runtime thread pools): a fork/thread bomb stops
  there instead of at the kernel's limit.
- Network: ``IPAddressDeny=any`` with ``IPAddressAllow=localhost`` and, when the broker's host
  is an IP literal, that address. A broker given by host name cannot be pinned this way
  (systemd filters addresses, not names, and the name may resolve differently later), so
  then the unit allows any address and says so in a comment.
"""

from __future__ import annotations

import ipaddress
import math
from urllib.parse import urlsplit

from edgesdk.schemas.profile import DeviceProfile

#: Interpreter, numpy, the runtimes' shared libraries and their arenas, the MQTT queue (MiB).
AGENT_BASE_MB = 256
#: Share of physical RAM the agent may use at most, whatever the model budget says.
MAX_RAM_SHARE = 0.75
TASKS_BASE = 64
TASKS_PER_CORE = 8

DROP_IN = "etc/systemd/system/edge-agent.service.d/limits.conf"


def memory_max_mb(profile: DeviceProfile) -> int:
    """The agent's hard memory limit in MiB (see the module docstring for the derivation)."""
    wanted = 2 * profile.memory.model_ram_budget_mb + AGENT_BASE_MB
    return max(AGENT_BASE_MB, min(wanted, math.floor(profile.memory.ram_mb * MAX_RAM_SHARE)))


def tasks_max(profile: DeviceProfile) -> int:
    """The most threads and processes the agent's cgroup may hold."""
    return TASKS_BASE + TASKS_PER_CORE * profile.cpu.cores


def broker_address(broker_url: str) -> str | None:
    """The broker's IP address when the URL names one literally; None for a host name."""
    host = urlsplit(broker_url).hostname
    if host is None:
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def render_limits_drop_in(profile: DeviceProfile, broker_url: str) -> str:
    """The text of ``edge-agent.service.d/limits.conf`` for ``profile`` and ``broker_url``."""
    memory = memory_max_mb(profile)
    address = broker_address(broker_url)
    lines = [
        f"# Rendered by the image builder for profile {profile.name} and broker {broker_url}",
        "# (edgesdk/image/unit_limits.py says how each value is derived).",
        "[Service]",
        f"# 2 x model budget ({profile.memory.model_ram_budget_mb} MiB) + {AGENT_BASE_MB} MiB, "
        f"at most {int(MAX_RAM_SHARE * 100)} % of {profile.memory.ram_mb} MiB RAM.",
        f"MemoryMax={memory}M",
        f"MemoryHigh={math.floor(memory * 0.9)}M",
        "MemorySwapMax=0",
        f"TasksMax={tasks_max(profile)}",
        "IPAddressDeny=any",
        "IPAddressAllow=localhost",
    ]
    if address is not None:
        lines.append(f"IPAddressAllow={address}")
    else:
        lines += [
            f"# The broker is a host name ({urlsplit(broker_url).hostname}): systemd filters addresses, not",
            "# names, so its address cannot be pinned here; any address is allowed instead.",
            "IPAddressAllow=any",
        ]
    return "\n".join(lines) + "\n"
