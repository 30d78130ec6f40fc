"""Run the SHIPPED mosquitto configuration (firmware_images/mosquitto/) on free local ports.

The attack tests must hit the file operators install, not a look-alike: this renders that very
file with test ports, the test PKI and test password files, and nothing else changed —
except, on request, with ``use_username_as_clientid`` taken out, which is the permissive
configuration before the fix (the positive control of the takeover test).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from edgesdk.mqtt.broker import find_mosquitto
from edgesdk.mqtt.client import ClientOptions, MqttClient, TlsSettings
from tests.broker_password_helpers import write_password_file
from tests.free_ports import free_ports
from tests.pki_helpers import LocalPki

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "firmware_images" / "mosquitto"
SHIPPED_CONF = SHIPPED_DIR / "mosquitto.conf"
SHIPPED_ACL = SHIPPED_DIR / "edgesdk.acl"
LISTENERS = {"devices": 8883, "operators": 8884, "enrollment": 8885}


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


@dataclass
class ShippedBroker:
    """mosquitto started from the shipped config; ``url(listener)`` gives each listener's address."""

    work_dir: Path
    pki: LocalPki
    device_passwords: Path
    operator_passwords: Path
    enroll_passwords: Path
    bind_client_ids: bool = True

    def __post_init__(self) -> None:
        self.ports = dict(zip(LISTENERS, free_ports(len(LISTENERS)), strict=True))
        self._handed_out = False  # a listener's address was given out: its port must stay
        self._process: subprocess.Popen[str] | None = None
        self.log_file = self.work_dir / "mosquitto.log"

    def url(self, listener: str) -> str:
        self._handed_out = True
        return f"mqtts://127.0.0.1:{self.ports[listener]}"

    def render(self) -> str:
        config = SHIPPED_CONF.read_text()
        for name, port in LISTENERS.items():
            config = config.replace(f"listener {port}\n", f"listener {self.ports[name]} 127.0.0.1\n")
        replacements = {
            "/etc/mosquitto/certs/ca.crt": self.pki.ca_file,
            "/etc/mosquitto/certs/server.crt": self.pki.server_cert,
            "/etc/mosquitto/certs/server.key": self.pki.server_key,
            "/etc/mosquitto/edgesdk.acl": SHIPPED_ACL,
            "/etc/mosquitto/edgesdk-devices.passwd": self.device_passwords,
            "/etc/mosquitto/edgesdk-enroll.passwd": self.enroll_passwords,
            "/etc/mosquitto/edgesdk.passwd": self.operator_passwords,
            "/var/lib/mosquitto/": f"{self.work_dir}/",
        }
        for old, new in replacements.items():
            config = config.replace(old, str(new))
        if not self.bind_client_ids:
            config = "\n".join(line for line in config.splitlines() if line != "use_username_as_clientid true")
        config += f"\nlog_dest file {self.log_file}\nconnection_messages true\n"
        if os.geteuid() == 0:
            config += "user root\n"  # as root mosquitto would drop to 'mosquitto', who cannot read 0600 files
        return config

    def start(self) -> ShippedBroker:
        binary = find_mosquitto()
        if binary is None:
            raise RuntimeError("mosquitto is not installed")
        # A port found free can be taken by another test process before mosquitto binds it (seen
        # with the suite in 4 processes): new ports and again, while none was handed out yet.
        for _ in range(5 if not self._handed_out else 1):
            path = self.work_dir / "shipped.conf"
            path.write_text(self.render())
            self._process = subprocess.Popen([binary, "-c", str(path)], stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(_accepts(p) for p in self.ports.values()):
                if self._process.poll() is not None:
                    break
                time.sleep(0.05)
            else:
                if self._process.poll() is None:
                    return self
            refused = f"{self._process.stderr.read() if self._process.stderr else ''} {self._log_tail()}"
            self.stop()
            if "in use" not in refused or self._handed_out:
                raise RuntimeError(f"mosquitto refused the shipped config: {refused}")
            self.ports = dict(zip(LISTENERS, free_ports(len(LISTENERS)), strict=True))
        raise RuntimeError(f"mosquitto found no free ports in 5 tries: {refused}")

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log_file.read_text(errors="replace").splitlines()[-5:])
        except FileNotFoundError:
            return ""

    def reload(self) -> None:
        """SIGHUP: mosquitto re-reads its password and ACL files (what the operator does after approve).
        Returns once it logged "Reloading config.": its one thread reloads right after that line,
        before it handles another client (a fixed pause could end first on a loaded machine)."""
        assert self._process is not None
        before = self._reloads()
        self._process.send_signal(1)
        deadline = time.monotonic() + 60
        while self._reloads() <= before:
            assert time.monotonic() < deadline, f"mosquitto did not reload in 60 s: {self._log_tail()}"
            time.sleep(0.05)

    def _reloads(self) -> int:
        try:
            return self.log_file.read_text(errors="replace").count("Reloading config.")
        except FileNotFoundError:
            return 0

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> ShippedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def shipped_broker(
    work_dir: Path, pki: LocalPki, devices: dict[str, str], *, bind_client_ids: bool = True
) -> ShippedBroker:
    """A ShippedBroker with these device passwords, operator ``fleet-operator``/``op`` and
    bootstrap ``edgesdk-enroll``/``enroll``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    device_file = work_dir / "devices.passwd"
    if devices:
        write_password_file(device_file, devices)
    else:
        device_file.write_text("")
    return ShippedBroker(
        work_dir,
        pki,
        device_passwords=device_file,
        operator_passwords=write_password_file(work_dir / "operators.passwd", {"fleet-operator": "op"}),
        enroll_passwords=write_password_file(work_dir / "enroll.passwd", {"edgesdk-enroll": "enroll"}),
        bind_client_ids=bind_client_ids,
    )


def shipped_client(
    broker: ShippedBroker, listener: str, client_id: str, user: str | None, password: str | None
) -> MqttClient:
    """A client of the shipped configuration's ``listener``: TLS with the test CA, user and password."""
    options = ClientOptions(
        client_id=client_id,
        broker_url=broker.url(listener),
        username=user,
        password=password,
        tls=TlsSettings(ca_file=str(broker.pki.ca_file)),
        backoff_min_s=0.2,
        clean_start=True,
        session_expiry_s=0,
    )
    return MqttClient(options)
