"""The device side of enrollment as a newcomer meets it, with real ``edge-agent`` processes:
``edge-agent key`` shows the full key id the operator is told to compare (and the PEM), and a
configured ``[ota] http_ca_file`` that does not exist stops ``edge-agent run`` at start, in
one line, as a missing key file does (not hours later, at the first HTTPS download)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgesdk.keys import key_id, load_device_public_key
from tests.agent_helpers import make_device, run_agent_cli
from tests.conftest import assert_one_line_error

pytestmark = [pytest.mark.integration, pytest.mark.needs_agent_extra]


def test_edge_agent_key_prints_the_full_key_id_then_the_pem(tmp_path: Path) -> None:
    device = make_device(tmp_path / "dev")
    expected = key_id(load_device_public_key(device.device_pub))
    shown = run_agent_cli("key", "--config", str(device.config))
    assert shown.returncode == 0, shown.stderr
    first, *pem = shown.stdout.splitlines()
    assert first == f"key id: {expected}"  # the whole id (32 hex digits), never a prefix
    assert re.fullmatch(r"key id: [0-9a-f]{32}", first)
    assert pem[0] == "-----BEGIN PUBLIC KEY-----" and pem[-1] == "-----END PUBLIC KEY-----"
    # What a script keeps with `edge-agent key > dev.pub` is still a key file (PEM readers skip the line).
    saved = tmp_path / "saved.pub"
    saved.write_text(shown.stdout)
    assert key_id(load_device_public_key(saved)) == expected

    as_json = run_agent_cli("key", "--config", str(device.config), "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown_json = json.loads(as_json.stdout)
    assert (shown_json["device_id"], shown_json["key_id"]) == ("dev-1", expected)
    assert shown_json["pem"].startswith("-----BEGIN PUBLIC KEY-----")


def test_a_missing_http_ca_file_stops_the_agent_at_start_in_one_line(tmp_path: Path) -> None:
    device = make_device(tmp_path / "dev")
    missing = tmp_path / "fleet-ca.pem"
    device.write_config(ota={"http_ca_file": str(missing)})
    started = run_agent_cli("run", "--config", str(device.config), timeout=30)
    assert_one_line_error(started, "http_ca_file", str(missing), "does not exist")
    assert started.returncode == 1
    # Relative to the config file's directory, like every other path in it.
    missing.write_text("not checked at start beyond being there\n")
    device.write_config(ota={"http_ca_file": "../fleet-ca.pem"})
    key = run_agent_cli("key", "--config", str(device.config))
    assert key.returncode == 0, key.stderr
