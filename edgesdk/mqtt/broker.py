"""Start a real mosquitto broker on 127.0.0.1 for tests, the demo and benchmarks.

The broker writes its own configuration into a private directory (plain or TLS listener on a
free port, optional ACL and password files, mTLS), waits until it accepts connections, and
keeps its port across ``restart()`` so clients can reconnect to the same address — that is
what the outage tests need. It never touches the system broker or port 1883.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from edgesdk.errors import LinkError

_SEARCH_PATH = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")
_START_TIMEOUT_S = 10.0


def find_mosquitto() -> str | None:
    """Path of the mosquitto binary, or ``None`` when it is not installed."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return next((path for path in _SEARCH_PATH if os.access(path, os.X_OK)), None)


@dataclass(frozen=True)
class BrokerTls:
    """TLS settings of the broker's listener.

    ``require_certificate`` turns on mutual TLS; with ``use_identity_as_username`` the client
    certificate's common name becomes the username the ACL sees (the device id).
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    require_certificate: bool = False
    use_identity_as_username: bool = False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MosquittoBroker:
    """A mosquitto process on 127.0.0.1; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        port: int = 0,
        *,
        acl_file: Path | None = None,
        password_file: Path | None = None,
        tls: BrokerTls | None = None,
        data_dir: Path | None = None,
        allow_anonymous: bool | None = None,
        max_queued_messages: int = 100_000,
        persistence: bool = True,
    ) -> None:
        self._requested_port = port
        self.port = port
        self.acl_file = acl_file
        self.password_file = password_file
        self.tls = tls
        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="edgesdk-mosquitto-")) if data_dir is None else Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if allow_anonymous is None:
            identity_from_cert = tls is not None and tls.require_certificate and tls.use_identity_as_username
            allow_anonymous = password_file is None and not identity_from_cert
        self.allow_anonymous = allow_anonymous
        self.max_queued_messages = max_queued_messages
        self.persistence = persistence
        self._process: subprocess.Popen[bytes] | None = None

    # -- addresses ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:PORT`` (``mqtts://`` with TLS)."""
        scheme = "mqtts" if self.tls else "mqtt"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "mosquitto.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> MosquittoBroker:
        """Start mosquitto and wait until it accepts TCP connections."""
        if self.is_running():
            return self
        binary = find_mosquitto()
        if binary is None:
            raise LinkError("mosquitto not found; install it (apt-get install mosquitto) or put it on PATH")
        # A free port found by binding can be taken by someone else before mosquitto binds it;
        # retry with a new one, but only while the port has not been handed out yet.
        attempts = 5 if self._requested_port == 0 and self.port == 0 else 1
        last_log = ""
        for _ in range(attempts):
            port = self.port or _free_port()
            config = self._write_config(port)
            with open(self.log_file, "ab") as log:
                self._process = subprocess.Popen(
                    [binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            if self._wait_listening(port):
                self.port = port
                return self
            last_log = self._tail_log()
            self._terminate()
        raise LinkError(f"mosquitto did not start on 127.0.0.1 (log {self.log_file}): {last_log}")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s); the port stays reserved for restart()."""
        self._terminate()

    def kill(self) -> None:
        """Stop the broker abruptly (SIGKILL), as a crash or power cut would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(5)
        self._process = None

    def restart(self) -> MosquittoBroker:
        """Stop and start again on the same port."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the broker and delete its private directory (if it created it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------
    def _write_config(self, port: int) -> Path:
        lines = [
            "per_listener_settings false",
            f"listener {port} 127.0.0.1",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            f"max_queued_messages {self.max_queued_messages}",
            "max_inflight_messages 0",
            # Without it every PUBACK can sit ~40 ms behind Nagle + delayed ACK: drains crawl.
            "set_tcp_nodelay true",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "connection_messages true",
            "log_timestamp true",
        ]
        if self.persistence:
            # Retained presence and persistent sessions survive restart(), like a real broker.
            lines += ["persistence true", f"persistence_location {self.data_dir}/", "autosave_interval 30"]
        if os.geteuid() == 0:
            # As root mosquitto would switch to the 'mosquitto' user, which cannot read our 0600 files.
            lines.append("user root")
        if self.password_file is not None:
            lines.append(f"password_file {self.password_file}")
        if self.acl_file is not None:
            lines.append(f"acl_file {self.acl_file}")
        if self.tls is not None:
            lines += [
                f"cafile {self.tls.ca_file}",
                f"certfile {self.tls.cert_file}",
                f"keyfile {self.tls.key_file}",
                f"require_certificate {'true' if self.tls.require_certificate else 'false'}",
                f"use_identity_as_username {'true' if self.tls.use_identity_as_username else 'false'}",
            ]
        config = self.data_dir / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return config

    def _wait_listening(self, port: int) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def _tail_log(self, lines: int = 5) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"
