"""The agent's systemd unit in every firmware recipe: hardened, consistent with the config."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

from edgesdk.image.agent_config import (
    CONFIG_FILE,
    RUNTIME_DIR,
    STATE_DIR,
    ProvisioningConfig,
    fill_placeholders,
    render_agent_config,
)
from edgesdk.image.recipes import load_recipes
from tests.image_helpers import parse_unit

RECIPES = load_recipes()
FAMILIES = sorted(RECIPES)


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key)
    assert values, f"{key}= missing"
    return values[-1]


def test_the_three_families_exist() -> None:
    assert {"raspberry-pi-os-arm64", "jetson-l4t", "debian-x86_64"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_unit_is_hardened(family: str) -> None:
    unit = parse_unit(RECIPES[family].unit_file.read_text())
    service = unit["Service"]
    expected = {
        "User": "edgesdk",
        "Group": "edgesdk",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "StateDirectory": "edgesdk",
        "RuntimeDirectory": "edgesdk",
        "Restart": "on-failure",
        "Type": "notify",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
        "ProtectKernelModules": "yes",
        "SystemCallFilter": "@system-service",
    }
    for key, value in expected.items():
        assert one(service, key) == value, (family, key)
    assert one(service, "StateDirectoryMode") == "0700"
    assert int(one(service, "WatchdogSec")) > 0
    assert "@ROOT@/var/lib/edgesdk" in one(service, "ReadWritePaths").split()
    assert "DynamicUser" not in service, "the device key needs a stable owner"
    start_limit = unit["Unit"]
    assert int(one(start_limit, "StartLimitBurst")) >= 1 and int(one(start_limit, "StartLimitIntervalSec")) > 0
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


@pytest.mark.parametrize("family", FAMILIES)
def test_exec_start_runs_the_venv_agent_with_the_installed_config(family: str) -> None:
    service = parse_unit(RECIPES[family].unit_file.read_text())["Service"]
    argv = shlex.split(one(service, "ExecStart"))
    assert argv[0] == "@ROOT@/opt/edgesdk/venv/bin/edge-agent"
    assert argv[argv.index("--config") + 1] == f"@ROOT@{CONFIG_FILE}"


@pytest.mark.parametrize("family", FAMILIES)
def test_unit_directories_match_the_rendered_config(family: str) -> None:
    service = parse_unit(RECIPES[family].unit_file.read_text())["Service"]
    text = render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtt://broker.local"))
    config = tomllib.loads(fill_placeholders(text, device_id="dev-1"))
    # systemd creates /var/lib/<StateDirectory> and /run/<RuntimeDirectory> for the agent's user.
    assert Path(config["data_dir"]) == Path("/var/lib") / one(service, "StateDirectory") == Path(str(STATE_DIR))
    assert Path(config["api"]["unix_socket"]).parent == Path("/run") / one(service, "RuntimeDirectory")
    assert Path(config["api"]["unix_socket"]).parent == Path(str(RUNTIME_DIR))
    assert "device_key" not in config  # made by the agent in data_dir on first start


@pytest.mark.parametrize("family", FAMILIES)
def test_recipe_groups_are_not_hard_requirements_of_the_unit(family: str) -> None:
    # SupplementaryGroups= naming a group the OS lacks stops the unit from starting; install.sh
    # adds the user only to groups that exist instead.
    service = parse_unit(RECIPES[family].unit_file.read_text())["Service"]
    assert "SupplementaryGroups" not in service
    assert RECIPES[family].user_groups


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_systemd_accepts_the_unit_and_rates_it_exposed_little(family: str, tmp_path: Path) -> None:
    unit = tmp_path / "edge-agent.service"
    # verify checks that ExecStart's program exists; the unit, not the agent, is under test here.
    agent = tmp_path / "opt/edgesdk/venv/bin/edge-agent"
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    unit.write_text(fill_placeholders(RECIPES[family].unit_file.read_text(), device_id="dev-1", root=str(tmp_path)))
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [line for line in verify.stderr.splitlines() if "edge-agent.service" in line]
    assert verify.returncode == 0 and not problems, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert found, security.stdout[-500:] + security.stderr
    # 0 is a fully locked-down unit, 10 an unprotected one; systemd calls < 4 "OK".
    assert float(found.group(1)) <= 3.0, security.stdout


# -- secrets and limits (issue 14: no core files, bounded memory and tasks, network pinned) ------


@pytest.mark.parametrize("family", FAMILIES)
def test_unit_writes_no_core_and_opens_only_ip_and_unix_sockets(family: str) -> None:
    service = parse_unit(RECIPES[family].unit_file.read_text())["Service"]
    assert one(service, "LimitCORE") == "0"
    assert one(service, "RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6"]
    assert one(service, "NoNewPrivileges") == "yes" and one(service, "PrivateTmp") == "yes"


def _drop_in(profile_name: str, broker: str) -> dict[str, list[str]]:
    from edgesdk.image.unit_limits import render_limits_drop_in
    from edgesdk.profiles import get_profile

    return parse_unit(render_limits_drop_in(get_profile(profile_name), broker))["Service"]


def test_limits_come_from_the_profile() -> None:
    from edgesdk.image.unit_limits import AGENT_BASE_MB, MAX_RAM_SHARE, TASKS_BASE, TASKS_PER_CORE
    from edgesdk.profiles import load_profiles

    for name, profile in load_profiles().items():
        service = _drop_in(name, "mqtts://10.0.0.5:8883")
        memory = int(one(service, "MemoryMax").removesuffix("M"))
        assert memory <= profile.memory.ram_mb * MAX_RAM_SHARE, name  # the OS keeps its share
        assert (
            memory
            == min(2 * profile.memory.model_ram_budget_mb + AGENT_BASE_MB, int(profile.memory.ram_mb * MAX_RAM_SHARE))
            or memory == AGENT_BASE_MB
        ), name
        assert int(one(service, "MemoryHigh").removesuffix("M")) < memory
        assert one(service, "MemorySwapMax") == "0"  # plaintext models never paged to disk
        assert int(one(service, "TasksMax")) == TASKS_BASE + TASKS_PER_CORE * profile.cpu.cores


@pytest.mark.parametrize(
    ("broker", "allowed"),
    [
        ("mqtts://10.0.0.5:8883", ["localhost", "10.0.0.5"]),
        ("mqtt://[fd00::7]:1883", ["localhost", "fd00::7"]),
        ("mqtts://broker.example.com:8883", ["localhost", "any"]),  # a name cannot be pinned
    ],
)
def test_network_is_denied_but_loopback_and_an_ip_literal_broker(broker: str, allowed: list[str]) -> None:
    service = _drop_in("rpi5-8gb", broker)
    assert service["IPAddressDeny"] == ["any"]
    assert service["IPAddressAllow"] == allowed


def test_the_image_builder_writes_the_drop_in_beside_the_unit(tmp_path: Path) -> None:
    from edgesdk.image.builder import ImageOptions, _write_overlay
    from edgesdk.image.unit_limits import DROP_IN
    from edgesdk.profiles import get_profile

    profile = get_profile("rpi5-8gb")
    options = ImageOptions(profile=profile, broker="mqtt://192.168.1.10:1883", out=tmp_path / "out")
    _write_overlay(options, RECIPES["raspberry-pi-os-arm64"], tmp_path)
    service = parse_unit((tmp_path / "overlay" / DROP_IN).read_text())["Service"]
    assert "192.168.1.10" in service["IPAddressAllow"]
    assert (tmp_path / "overlay" / "etc/systemd/system/edge-agent.service").is_file()


@pytest.mark.parametrize("family", FAMILIES)
def test_systemd_accepts_the_unit_with_its_limits_drop_in(family: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit and its drop-in are not checked by systemd")
    from edgesdk.image.unit_limits import render_limits_drop_in
    from edgesdk.profiles import get_profile

    agent = tmp_path / "opt/edgesdk/venv/bin/edge-agent"
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    units = tmp_path / "units"
    (units / "edge-agent.service.d").mkdir(parents=True)
    unit = units / "edge-agent.service"
    unit.write_text(fill_placeholders(RECIPES[family].unit_file.read_text(), device_id="dev-1", root=str(tmp_path)))
    (units / "edge-agent.service.d" / "limits.conf").write_text(
        render_limits_drop_in(get_profile("rpi5-8gb"), "mqtts://10.0.0.5:8883")
    )
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        env={"SYSTEMD_UNIT_PATH": f"{units}:", "PATH": "/usr/bin:/bin"},
    )
    problems = [line for line in verify.stderr.splitlines() if "edge-agent.service" in line or "limits.conf" in line]
    assert verify.returncode == 0 and not problems, verify.stderr
