"""Building a device for agent tests: keys, a data dir, a config file, real digits bundles,
and a real ``edge-agent run`` process on an ephemeral port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE = "rpi5-8gb"


@dataclass
class Device:
    """A device's files: data dir (with its device key), publisher keys, config."""

    root: Path
    data_dir: Path
    publisher_key: Path
    publisher_pub: Path
    device_pub: Path
    config: Path
    settings: dict[str, Any] = field(default_factory=dict)

    def write_config(self, **overrides: Any) -> Path:
        """(Re)write the TOML config; keyword sections merge into the defaults."""
        settings = {
            "device_id": "dev-1",
            "profile": PROFILE,
            "data_dir": str(self.data_dir),
            "publisher_keys": [str(self.publisher_pub)],
            "log_format": "text",
            "api": {"host": "127.0.0.1", "port": 0},
            "governor": {"source": "psutil", "poll_interval_s": 0.2},
            # Profiling at install is tested on its own (test_install_profiling.py): elsewhere its
            # background child would change what a test looks at (the CPU, the ladder it reloads).
            "profiling": {"on_install": False},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(settings.get(key), dict):
                settings[key] = {**settings[key], **value}
            else:
                settings[key] = value
        self.settings = settings
        self.config.write_text(to_toml(settings))
        return self.config

    def model_dir(self, name: str = "digits") -> Path:
        """Where the agent keeps model ``name``'s store and update record (agent/installed_models.py)."""
        return self.data_dir / "models" / name

    def install(self, convert_dir: Path, *, name: str, version: str = "1.0.0", release: int = 1) -> Path:
        """Package ``convert_dir`` for this device and ``edge-agent install`` it (sideload); the bundle."""
        bundle = self.bundle(convert_dir, version=version, release=release, name=name)
        installed = run_agent_cli("install", "--config", str(self.config), str(bundle))
        assert installed.returncode == 0, installed.stderr
        return bundle

    def bundle(self, convert_dir: Path, *, version: str, release: int, name: str = "digits") -> Path:
        from edgesdk.bundle import package_bundle

        out = self.root / f"{name}-{version}.edgepkg"
        return package_bundle(
            convert_dir,
            name=name,
            version=version,
            release=release,
            publisher_key=self.publisher_key,
            recipients=[self.device_pub],
            targets=[PROFILE],
            out=out,
        )


def to_toml(settings: dict[str, Any]) -> str:
    """A tiny TOML writer for flat values and one level of tables, deeper ones inline (enough for AgentConfig)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):  # a table inside a table: an inline table
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + "}"
        return json.dumps(str(v))

    top = [f"{k} = {value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    tables = [
        f"\n[{k}]\n" + "\n".join(f"{kk} = {value(vv)}" for kk, vv in v.items() if vv is not None)
        for k, v in settings.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


def make_device(root: Path) -> Device:
    from edgesdk.agent.security_state import create_with_new_key

    from edgesdk.keys import generate_device_key, generate_publisher_key

    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    data_dir.mkdir(mode=0o700)
    device_key, device_pub = generate_device_key(data_dir)
    create_with_new_key(data_dir, device_key)  # a key without its security state record is tampered with
    publisher_key, publisher_pub = generate_publisher_key(root / "publisher")
    device = Device(root, data_dir, publisher_key, publisher_pub, device_pub, root / "agent.toml")
    device.write_config()
    return device


def agent_env(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_AGENT")}
    env.pop("CI", None)  # the agent must disable telemetry itself, not rely on CI=true
    if home is not None:
        env["HOME"] = str(home)
    return env


def run_agent_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgesdk.agent.cli", *args],
        capture_output=True,
        text=True,
        env=env or agent_env(),
        timeout=timeout,
    )


class AgentProcess:
    """``edge-agent run --config FILE`` in a subprocess; ``.url`` once it listens.

    ``argv`` runs another command that starts the same agent (tests/faulty_agent.py)."""

    def __init__(
        self,
        device: Device,
        *,
        env: dict[str, str] | None = None,
        start_timeout: float = 60,
        argv: list[str] | None = None,
    ) -> None:
        self.device = device
        self.argv = argv or [sys.executable, "-m", "edgesdk.agent.cli", "run", "--config", str(device.config)]
        self.env = env or agent_env()
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.stderr_path = device.root / f"agent-{time.monotonic_ns()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AgentProcess:
        port_file = self.device.data_dir / "api.port"
        port_file.unlink(missing_ok=True)
        self._log = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            if port_file.exists():
                text = port_file.read_text().strip()
                if text:
                    self.port = int(text)
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"agent did not start in {self.start_timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raw_exchange(port: int, data: bytes, *, timeout: float = 10) -> bytes:
    """Send raw bytes to 127.0.0.1:port and read until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)
