"""A throwaway RabbitMQ cluster with the MQTT plugin, on loopback, for tests.

Each node is Debian's ``rabbitmq-server`` started directly (not the system service) with its
own node name, AMQP and distribution ports, MQTT listener, data and log directories; all share
one Erlang cookie (``HOME/.erlang.cookie``) and a private ``epmd`` on a free port
(``ERL_EPMD_PORT``), so nothing touches another RabbitMQ on the machine. Node 2.. join node 1
with ``rabbitmqctl join_cluster``. ``find_rabbitmq()`` is None when the server is missing (the
tests then skip, visibly). Starting a node takes tens of seconds: start the cluster once per
module.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.free_ports import free_ports

_BIN = Path("/usr/lib/rabbitmq/bin")


def find_rabbitmq() -> Path | None:
    """The directory holding ``rabbitmq-server`` and ``rabbitmqctl`` (Debian's layout), or None."""
    if (_BIN / "rabbitmq-server").is_file() and (_BIN / "rabbitmqctl").is_file():
        return _BIN
    found = shutil.which("rabbitmq-server")
    return Path(found).parent if found and shutil.which("rabbitmqctl") else None


class RabbitCluster:
    """``start()`` → ``mqtt_url(i)`` for node i; ``stop()`` removes everything."""

    def __init__(self, bin_dir: Path, nodes: int = 2) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="edgesdk-rabbit-", dir="/tmp"))
        self.home = self.root / "home"
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        # epmd, then per node: MQTT, AMQP and Erlang distribution, all distinct.
        ports = free_ports(1 + 3 * nodes)
        self.epmd_port = ports[0]
        tag = secrets.token_hex(3)
        self.names = [f"edgesdk-{tag}-{i}@localhost" for i in range(nodes)]
        self.mqtt_ports = ports[1 : 1 + nodes]
        self.amqp_ports = ports[1 + nodes : 1 + 2 * nodes]
        self.dist_ports = ports[1 + 2 * nodes :]
        self._processes: list[subprocess.Popen[bytes]] = []

    def _env(self, index: int) -> dict[str, str]:
        node = self.root / f"node{index}"
        return {
            **os.environ,
            "HOME": str(self.home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.names[index],
            "RABBITMQ_NODE_PORT": str(self.amqp_ports[index]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[index]),
            "RABBITMQ_MNESIA_BASE": str(node / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(node / "rabbitmq.conf"),
            "RABBITMQ_PID_FILE": str(node / "rabbitmq.pid"),
        }

    def ctl(self, index: int, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / "rabbitmqctl"), "-n", self.names[index], *argv]
        env = {**os.environ, "HOME": str(self.home), "ERL_EPMD_PORT": str(self.epmd_port)}
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)

    def start(self) -> RabbitCluster:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> RabbitCluster:
        for index, port in enumerate(self.mqtt_ports):
            node = self.root / f"node{index}"
            node.mkdir()
            (node / "rabbitmq.conf").write_text(
                f"mqtt.listeners.tcp.default = 127.0.0.1:{port}\n"
                "mqtt.allow_anonymous = true\n"
                "loopback_users = none\n"
                f"listeners.tcp.default = 127.0.0.1:{self.amqp_ports[index]}\n"
            )
            env = self._env(index)
            log = open(node / "server.out", "wb")  # noqa: SIM115 - the child owns it
            self._processes.append(
                subprocess.Popen(
                    [str(self.bin_dir / "rabbitmq-server")],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.root,
                )
            )
        for index in range(len(self.names)):
            pid_file = self.root / f"node{index}" / "rabbitmq.pid"
            # A node that cannot start (a port taken) exits and leaves rabbitmqctl waiting out its
            # timeout: 180 s is several times a start on a busy 2-core machine.
            waited = self.ctl(index, "wait", str(pid_file), "--timeout", "180", timeout=240)
            if waited.returncode != 0:
                raise RuntimeError(f"RabbitMQ node {self.names[index]} did not start: {waited.stderr or waited.stdout}")
        for index in range(1, len(self.names)):
            for argv in (("stop_app",), ("join_cluster", self.names[0]), ("start_app",)):
                done = self.ctl(index, *argv)
                if done.returncode != 0:
                    raise RuntimeError(f"rabbitmqctl {' '.join(argv)} on {self.names[index]}: {done.stderr}")
        for port in self.mqtt_ports:
            self._wait_listening(port)
        return self

    def mqtt_url(self, index: int) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_ports[index]}"

    def running_nodes(self) -> str:
        return self.ctl(0, "cluster_status").stdout

    def _wait_listening(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"RabbitMQ's MQTT listener on {port} never opened")

    def stop(self) -> None:
        """Stop every node (also after a failed start): ``rabbitmqctl stop``, then SIGKILL the
        Erlang VM named by each node's pid file and the launcher's process group."""
        for index in range(len(self._processes)):
            try:
                self.ctl(index, "stop", timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for index, process in enumerate(self._processes):
            pid_file = self.root / f"node{index}" / "rabbitmq.pid"
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)  # the VM: it outlives its launcher
            except (OSError, ValueError):
                pass
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        if Path(epmd).exists():
            env = {**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)}
            subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"], capture_output=True, env=env, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
