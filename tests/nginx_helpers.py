"""nginx from Debian serving files on an ephemeral port, for the artifact-over-HTTP tests and
benchmarks: a tiny config in a temp dir, ``nginx -p DIR -c nginx.conf -g 'daemon off;'``, an
access log that records each request's Range header and the body bytes it sent."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class AccessEntry:
    status: int
    range: str  # "-" when the request had none
    body_bytes: int
    bytes_sent: int  # headers + body
    request_bytes: int  # request line + headers
    uri: str


@dataclass
class Nginx:
    """``root`` is served at ``/``; ``limit_rate`` (e.g. ``"64k"``) slows each connection;
    ``tls`` is (certificate, key); ``extra`` goes into the server block (redirects...)."""

    directory: Path
    root: Path
    port: int = field(default_factory=free_port)
    limit_rate: str | None = None
    tls: tuple[Path, Path] | None = None
    extra: str = ""
    worker_connections: int = 1024
    workers: int = 1
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"

    def write_config(self) -> Path:
        d = self.directory
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (d / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        listen = f"127.0.0.1:{self.port}" + (" ssl" if self.tls else "")
        tls = f"ssl_certificate {self.tls[0]};\n        ssl_certificate_key {self.tls[1]};" if self.tls else ""
        rate = f"limit_rate {self.limit_rate};" if self.limit_rate else ""
        # As root nginx's workers would drop to nobody, who cannot read pytest's 0700 temp dirs.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = d / "nginx.conf"
        conf.write_text(
            f"""{user}worker_processes {self.workers};
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections {self.worker_connections}; }}
http {{
    log_format ota '$status "$http_range" $body_bytes_sent $bytes_sent $request_length $request_uri';
    access_log {d}/access.log ota;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    types {{ application/octet-stream edgepkg; }}
    sendfile on;
    keepalive_timeout 30;
    server {{
        listen {listen};
        {tls}
        root {self.root};
        {rate}
        {self.extra}
    }}
}}
"""
        )
        return conf

    def start(self) -> Nginx:
        conf = self.write_config()
        self.process = subprocess.Popen(
            [
                NGINX,
                "-p",
                str(self.directory),
                "-e",
                str(self.directory / "error.log"),
                "-c",
                str(conf),
                "-g",
                "daemon off;",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a kill takes the worker too
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"nginx exited {self.process.returncode}: {err}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not listen within 60 s")

    def kill(self) -> None:
        """SIGKILL master and worker: a cut, not a graceful stop (nothing is logged for the
        request in flight)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.process = None

    def entries(self) -> list[AccessEntry]:
        if not self.access_log.exists():
            return []
        found = []
        for line in self.access_log.read_text().splitlines():
            status, rest = line.split(" ", 1)
            quoted, _, tail = rest[1:].partition('" ')
            body, sent, asked, uri = tail.split(" ", 3)
            found.append(AccessEntry(int(status), quoted, int(body), int(sent), int(asked), uri))
        return found


def nginx_available() -> bool:
    return Path(NGINX).exists()
