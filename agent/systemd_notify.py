"""systemd's notify protocol (``sd_notify``) without a dependency: readiness and watchdog.

The unit runs the agent with ``Type=notify`` and ``WatchdogSec=``: systemd waits for
``READY=1`` before it calls the service started, and kills and restarts it when ``WATCHDOG=1``
stops arriving. Outside systemd (``NOTIFY_SOCKET`` unset) every call is a no-op, so the daemon
can call these unconditionally.

The daemon should call :func:`notify_ready` once the local API listens, :func:`notify_stopping`
when it shuts down, and run a :class:`Watchdog` whose health check asks its serving loop
whether it still turns (a thread that pings unconditionally would hide a hung agent).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()  # abstract namespace socket
    if raw.startswith("/"):
        return raw
    return None  # vsock and other forms are not used for services on a device


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; False when not under systemd or on failure."""
    raw = os.environ.get(NOTIFY_SOCKET_ENV)
    if not raw:
        return False
    address = _address(raw)
    if address is None:
        log.warning("NOTIFY_SOCKET %r is not a path or abstract socket; not notifying systemd", raw)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not notify systemd (%s): %s", state.split("=", 1)[0], exc)
        return False
    return True


def notify_ready(status: str | None = None) -> bool:
    """Tell systemd the service is up (``READY=1``), with an optional status line."""
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def notify_status(status: str) -> bool:
    """Update the status line ``systemctl status`` shows."""
    return notify(f"STATUS={status}")


def notify_stopping() -> bool:
    """Tell systemd the service is shutting down on purpose (``STOPPING=1``)."""
    return notify("STOPPING=1")


def notify_watchdog() -> bool:
    """Ping the watchdog once (``WATCHDOG=1``)."""
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """systemd's watchdog timeout for this process in seconds, or None if none is armed."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class Watchdog:
    """Pings systemd's watchdog at half its timeout while ``is_healthy()`` returns True.

    When the check fails (or raises) the ping is skipped, so systemd restarts a hung agent.
    """

    def __init__(self, is_healthy: Callable[[], bool] = lambda: True, interval_s: float | None = None) -> None:
        timeout = watchdog_interval_s()
        self.interval_s = interval_s if interval_s is not None else (timeout / 2 if timeout else None)
        self._is_healthy = is_healthy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def armed(self) -> bool:
        return self.interval_s is not None

    def start(self) -> Watchdog:
        """Start pinging in a daemon thread (does nothing when systemd armed no watchdog)."""
        if self.interval_s is None or self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="systemd-watchdog", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = self.interval_s or 1.0
        while not self._stop.wait(interval):
            try:
                healthy = self._is_healthy()
            except Exception:  # noqa: BLE001 — a failing check means "not healthy", never a dead thread
                log.exception("watchdog health check raised")
                healthy = False
            if healthy:
                notify_watchdog()
            else:
                log.warning("agent unhealthy: not pinging the systemd watchdog")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
