"""sd_notify readiness and watchdog pings, against a real Unix datagram socket."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from edgesdk.agent import systemd_notify


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def test_without_systemd_every_call_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert systemd_notify.notify_ready() is False
    assert systemd_notify.watchdog_interval_s() is None
    assert systemd_notify.Watchdog().start().armed is False


def test_ready_and_stopping_reach_systemd(notify_socket: socket.socket) -> None:
    assert systemd_notify.notify_ready("serving digits 1.0.0")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=serving digits 1.0.0"
    assert systemd_notify.notify_stopping()
    assert notify_socket.recv(4096) == b"STOPPING=1"


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"edgesdk-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd_notify.notify_watchdog()
        assert sock.recv(64) == b"WATCHDOG=1"


def test_unreachable_socket_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert systemd_notify.notify_ready() is False


def test_watchdog_interval_is_half_the_timeout_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd_notify.watchdog_interval_s() == 30.0
    assert systemd_notify.Watchdog().interval_s == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # armed for another process
    assert systemd_notify.watchdog_interval_s() is None


def test_watchdog_pings_only_while_healthy(notify_socket: socket.socket) -> None:
    healthy = {"value": True}
    looked_unhealthy = threading.Event()

    def is_healthy() -> bool:
        if not healthy["value"]:
            looked_unhealthy.set()
        return healthy["value"]

    dog = systemd_notify.Watchdog(is_healthy, interval_s=0.05).start()
    try:
        assert notify_socket.recv(64) == b"WATCHDOG=1"
        healthy["value"] = False
        # A ping decided before the watchdog saw it unhealthy is sent before its next check: once
        # that check has run, every ping on its way has arrived (a fixed 0.1 s could be too short
        # for a thread descheduled on a loaded machine).
        assert looked_unhealthy.wait(30)
        notify_socket.setblocking(False)
        while True:
            try:
                notify_socket.recv(64)
            except BlockingIOError:
                break
        notify_socket.settimeout(0.3)
        with pytest.raises(TimeoutError):
            notify_socket.recv(64)
    finally:
        dog.stop()


def test_watchdog_treats_a_raising_check_as_unhealthy(notify_socket: socket.socket) -> None:
    def broken() -> bool:
        raise RuntimeError("serving loop state unreadable")

    dog = systemd_notify.Watchdog(broken, interval_s=0.05).start()
    try:
        notify_socket.settimeout(0.3)
        with pytest.raises(TimeoutError):
            notify_socket.recv(64)
    finally:
        dog.stop()
