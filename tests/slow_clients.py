"""Slow clients held against a server for a while (issue 37, finding 6): slowloris connections
that send a header block a byte at a time, and bodies that declare ``Content-Length`` and send
a byte at a time. Every connection the server closes is opened again at once, as an attacker
would, so the pressure lasts as long as the crowd is held. One thread, non-blocking sockets.

Used by tests/integration/test_agent_slow_clients.py and benchmarks/bench_slow_clients.py."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass

#: Where each kind of slow connection starts; the rest comes a byte at a time.
SLOWLORIS_HEAD = b"POST /v1/models/digits/infer HTTP/1.1\r\nHost: agent\r\nX-Slow: "


def slow_body_head(declared: int) -> bytes:
    return (
        b"POST /v1/models/digits/infer HTTP/1.1\r\nHost: agent\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % declared
    )


@dataclass
class _Slow:
    sock: socket.socket
    head: bytes


class SlowCrowd:
    """``slowloris`` header-block connections and ``bodies`` slow bodies of ``declared`` bytes
    each, to ``address`` (a (host, port) pair or a Unix socket path); every ``interval_s`` each
    sends one more byte. ``opened``: connections opened in all (reopened ones included)."""

    def __init__(
        self,
        address: tuple[str, int] | str,
        *,
        slowloris: int,
        bodies: int,
        declared: int = 16 * 1024 * 1024,
        interval_s: float = 1.0,
    ) -> None:
        self.address = address
        self.heads = [SLOWLORIS_HEAD] * slowloris + [slow_body_head(declared)] * bodies
        self.interval_s = interval_s
        self.opened = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-crowd", daemon=True)
        self._selector = selectors.DefaultSelector()
        self._slow: dict[int, _Slow] = {}

    def _open(self, head: bytes) -> None:
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(2)
        try:
            sock.connect(self.address)
            sock.sendall(head)
        except OSError:
            self.refused += 1
            sock.close()
            return
        sock.setblocking(False)
        self.opened += 1
        self._slow[sock.fileno()] = _Slow(sock, head)
        self._selector.register(sock, selectors.EVENT_READ)

    def _reopen(self, slow: _Slow) -> None:
        self._selector.unregister(slow.sock)
        del self._slow[slow.sock.fileno()]
        slow.sock.close()
        if not self._stop.is_set():
            self._open(slow.head)

    def _run(self) -> None:
        for head in self.heads:
            self._open(head)
        next_byte = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=min(0.05, max(0.0, next_byte - time.monotonic()))):
                slow = self._slow.get(key.fd)
                if slow is None:
                    continue
                try:
                    data = slow.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data or data.startswith(b"HTTP/1.1 "):  # answered (408, 503) or closed: again
                    self._reopen(slow)
            if time.monotonic() >= next_byte:
                next_byte += self.interval_s
                for slow in list(self._slow.values()):
                    try:
                        slow.sock.send(b"x")
                    except OSError:
                        self._reopen(slow)
        for slow in list(self._slow.values()):
            slow.sock.close()
        self._selector.close()

    def held(self) -> int:
        return len(self._slow)

    def __enter__(self) -> SlowCrowd:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
