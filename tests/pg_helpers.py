"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl on a unix socket in a temp dir
and an ephemeral port, as the ``postgres`` user when run as root (initdb refuses root).
``find_pg_bin()`` is None when the server binaries are missing (the tests then skip, visibly)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def find_pg_bin() -> Path | None:
    """The directory holding initdb and pg_ctl (Debian: /usr/lib/postgresql/N/bin), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in candidates:
        if Path(directory, "initdb").is_file() and Path(directory, "pg_ctl").is_file():
            return Path(directory)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """``start()`` → ``url(dbname)``; ``create_database(name)``; ``stop()`` removes everything."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="edgesdk-pg-", dir="/tmp"))
        self.root.chmod(0o755)  # the server user must reach its data and socket dirs
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.port = _free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/tmp")

    def start(self) -> PostgresCluster:
        for directory in (self.data, self.socket_dir):
            directory.mkdir()
            if self.user is not None:
                entry = pwd.getpwnam(self.user)
                os.chown(directory, entry.pw_uid, entry.pw_gid)
        init = self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr}")
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses='' -c fsync=on"
        started = self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.socket_dir / "server.log"), "-w", "start"
        )
        if started.returncode != 0:
            log = (self.socket_dir / "server.log").read_text() if (self.socket_dir / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{log}")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}&port={self.port}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(host=str(self.socket_dir), port=self.port, user="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@contextmanager
def throwaway_cluster() -> Iterator[PostgresCluster]:
    """A started cluster, stopped afterwards; a visible skip where the server binaries are missing
    (for module-scoped ``postgres`` fixtures)."""
    import pytest

    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed; scripts/test installs postgresql")
    cluster = PostgresCluster(bin_dir).start()
    try:
        yield cluster
    finally:
        cluster.stop()
