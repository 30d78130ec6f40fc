"""Mosquitto password files for test brokers (no production code writes one: the fleet
service keeps its own, see edgesdk/fleet/broker_credentials.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from edgesdk.errors import LinkError


def find_mosquitto_passwd() -> str | None:
    """Path of ``mosquitto_passwd`` (hashes password files), or ``None``."""
    found = shutil.which("mosquitto_passwd")
    if found:
        return found
    candidate = "/usr/bin/mosquitto_passwd"
    return candidate if os.access(candidate, os.X_OK) else None


def write_password_file(path: Path, users: dict[str, str]) -> Path:
    """Write a mosquitto password file (hashed by ``mosquitto_passwd``) for ``users``."""
    tool = find_mosquitto_passwd()
    if tool is None:
        raise LinkError("mosquitto_passwd not found; install the mosquitto package (apt-get install mosquitto)")
    path.write_text("")
    path.chmod(0o600)
    for user, password in users.items():
        proc = subprocess.run([tool, "-b", str(path), user, password], capture_output=True, text=True)
        if proc.returncode != 0:
            raise LinkError(f"mosquitto_passwd failed for user {user!r}: {proc.stderr.strip() or proc.stdout.strip()}")
    return path
