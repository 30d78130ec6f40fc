"""Helpers for the provisioning image tests: reading systemd units, needing the package index."""

from __future__ import annotations

import subprocess
import sys

import pytest


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections → key → every value (systemd keys may repeat, e.g. DeviceAllow)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"key outside a section: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def require_package_index() -> None:
    """Skip visibly when pip cannot reach its index (image builds resolve real wheels from it)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "paho-mqtt", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"the package index cannot be reached: {probe.stderr.strip().splitlines()[-1:]}")
