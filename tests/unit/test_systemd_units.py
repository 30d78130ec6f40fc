"""The agent's systemd unit as systemd itself reads it: each firmware family's
``edge-agent.service`` with the ``limits.conf`` drop-in the image builder renders for every
shipped profile, checked by ``systemd-analyze verify``.

systemd ignores a key it does not know and a value it cannot parse, with a warning and exit
status 0: a misspelled hardening option (``ProtectSytem=strict``) would leave the agent
unprotected without a word. So the verdict here is systemd-analyze's output, which must be empty."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edgesdk.image.recipes import load_recipes, recipe_for
from edgesdk.image.unit_limits import DROP_IN, render_limits_drop_in
from edgesdk.profiles import load_profiles

UNIT = "etc/systemd/system/edge-agent.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (Debian package systemd; scripts/test installs it)"
)


def _imaged_profiles() -> list[str]:
    names = []
    for name, profile in sorted(load_profiles().items()):
        try:
            recipe_for(profile)
        except Exception:  # noqa: BLE001 - a profile no family fits (a Mac, a phone) gets no unit
            continue
        names.append(name)
    return names


def _render(root: Path, family: str, profile_name: str, broker: str) -> Path:
    """The unit as install.sh writes it into ``root`` (``@ROOT@`` = root), with the drop-in and
    an executable where ExecStart points; returns the directory to search for units."""
    recipe = load_recipes()[family]
    text = (recipe.overlay / UNIT).read_text(encoding="utf-8").replace("@ROOT@", str(root))
    unit = root / UNIT
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(text, encoding="utf-8")
    drop_in = root / DROP_IN
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(render_limits_drop_in(load_profiles()[profile_name], broker), encoding="utf-8")
    agent = root / "opt/edgesdk/venv/bin/edge-agent"
    agent.parent.mkdir(parents=True, exist_ok=True)
    agent.write_text("#!/bin/sh\n", encoding="utf-8")
    agent.chmod(0o755)
    return unit.parent


def _verify(unit_dir: Path) -> str:
    # SYSTEMD_UNIT_PATH (trailing ":" = and the defaults) makes systemd load the drop-in beside it.
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:", "SYSTEMD_LOG_COLOR": "0"}
    proc = subprocess.run(
        [str(SYSTEMD_ANALYZE), "verify", "--man=no", str(unit_dir / "edge-agent.service")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return (proc.stdout + proc.stderr).strip() + ("" if proc.returncode == 0 else f"\n(exit {proc.returncode})")


@needs_systemd
@pytest.mark.parametrize("profile_name", _imaged_profiles())
@pytest.mark.parametrize("broker", ["mqtts://10.0.0.5:8883", "mqtts://broker.example:8883"])
def test_every_profiles_unit_and_limits_pass_systemd_verify(tmp_path, profile_name, broker) -> None:
    family = recipe_for(load_profiles()[profile_name]).family
    unit_dir = _render(tmp_path / "root", family, profile_name, broker)
    assert _verify(unit_dir) == ""


@needs_systemd
def test_verify_names_a_misspelled_option_and_a_bad_limit(tmp_path) -> None:
    """The control: the same check on a unit with a typo and a drop-in with a bad value fails."""
    unit_dir = _render(tmp_path / "root", "debian-x86_64", "intel-nuc-core-ultra", "mqtt://127.0.0.1:1883")
    unit = unit_dir / "edge-agent.service"
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    drop_in = unit_dir / "edge-agent.service.d" / "limits.conf"
    drop_in.write_text(drop_in.read_text().replace("TasksMax=", "TasksMax=lots"))
    said = _verify(unit_dir)
    assert "ProtectSytem" in said and "lots" in said, said
