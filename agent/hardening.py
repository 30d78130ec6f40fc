"""Process hardening for the processes that hold secrets: no core dumps, no peeking by peers.

The daemon holds decrypted models (and, with ``unseal = "in_process"``, the device's private
key); the unseal helper holds both. A crash must not write them to disk as a core file, and
another process of the same user must not read them through ``ptrace`` or ``/proc/PID/mem``.
So both set, first thing:

- ``RLIMIT_CORE`` to 0 (soft and hard, so a child cannot raise it again): the kernel writes no
  core file, whatever ``/proc/sys/kernel/core_pattern`` says — except a pipe handler
  (``|/usr/lib/systemd/systemd-coredump``), which the kernel runs regardless of the limit;
- ``prctl(PR_SET_DUMPABLE, 0)``: the kernel skips the dump for a non-dumpable process, pipe
  handlers included, and ``/proc/PID/mem``, ``maps`` and ``ptrace`` need ``CAP_SYS_PTRACE``.

The systemd units add ``LimitCORE=0`` (``firmware_images/``), so the limit holds before the
interpreter even starts. Elsewhere than Linux the prctl is not there: that is logged, not fatal.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("edgesdk.agent.hardening")

#: From <linux/prctl.h>.
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def _disable_core_files() -> bool:
    try:
        import resource
    except ImportError:  # not POSIX
        return False
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError) as exc:
        log.warning("cannot set RLIMIT_CORE to 0: %s", exc)
        return False
    return True


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


def _make_undumpable() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    if libc is None:
        log.warning("cannot load libc to call prctl(PR_SET_DUMPABLE, 0)")
        return False
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())
        return False
    return True


def is_dumpable() -> bool | None:
    """Whether this process may dump core / be ptraced by its user; None where unknown."""
    libc = _libc() if sys.platform.startswith("linux") else None
    if libc is None:
        return None
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def harden_process() -> dict[str, bool]:
    """No core file and no dumpable flag for this process; says which of the two took effect."""
    done = {"rlimit_core_0": _disable_core_files(), "not_dumpable": _make_undumpable()}
    if not all(done.values()):
        missing = ", ".join(name for name, ok in done.items() if not ok)
        log.info("process hardening not available here (%s): %s", sys.platform, missing)
    return done
