"""``edgesdk fleet push/status/abort/rollback`` as a subprocess against a real mosquitto and
in-process devices (real agent parts + link + UpdateManager); bad input gives one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agent_wiring_helpers import updater_for
from tests.conftest import assert_one_line_error
from tests.ota_helpers import OtaBundles, StandInAgent, build_ota_bundles

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("ota-cli-bundles"))


def test_push_status_rollback(tmp_path: Path, bundles: OtaBundles, mqtt_broker, edgesdk_cli) -> None:
    agents = []
    for i in range(2):
        agent = StandInAgent(
            tmp_path / f"dev-{i}", bundles, device_id=f"dev-{i}", broker_url=mqtt_broker.url, groups=("lab",)
        )
        manager = updater_for(agent)
        manager.install_local(bundles.v1, timeout=60)
        assert agent.link.client.wait_connected(60)
        agents.append(agent)
    db = tmp_path / "fleet.sqlite3"
    common = ["--broker", mqtt_broker.url, "--operator-key", str(bundles.operator_key), "--db", str(db)]
    try:
        push = edgesdk_cli(
            "fleet", "push", str(bundles.v2), "--group", "lab", "--canary", "50%", "--waves", "100%",
            "--probation", "1s", "--max-failures", "0%", "--deployment-id", "cli-1", "--expires", "30m", *common,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr + push.stdout
        assert "SUCCEEDED" in push.stdout and "canary" in push.stdout
        assert [a.server.running_model().release for a in agents] == [2, 2]

        status = edgesdk_cli("fleet", "status", "cli-1", "--json", "--db", str(db))
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["state"] == "SUCCEEDED" and report["by_state"] == {"COMMITTED": 2}
        assert report["plan"]["command_ttl_s"] == 1800  # each command sent lived 30 minutes
        assert {d["device_id"] for d in report["device_states"]} == {"dev-0", "dev-1"}
        listing = edgesdk_cli("fleet", "status", "--db", str(db))
        assert "cli-1" in listing.stdout

        rollback = edgesdk_cli("fleet", "rollback", "cli-1", "--wait", "60s", "--expires", "10m", *common)
        assert rollback.returncode == 0, rollback.stderr + rollback.stdout
        assert [a.server.running_model().release for a in agents] == [1, 1]
        again = edgesdk_cli("fleet", "push", str(bundles.v2), "--devices", "dev-0", "--deployment-id", "cli-1", *common)
        assert_one_line_error(again, "cli-1", "ROLLED_BACK")
        forever = edgesdk_cli("fleet", "push", str(bundles.v2), "--devices", "dev-0", "--expires", "0s", *common)
        assert_one_line_error(forever, "--expires", "'0s'")
    finally:
        for agent in agents:
            agent.link.stop()


def test_abort_from_another_shell_cancels_devices_in_probation(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, edgesdk_cli
) -> None:
    import subprocess
    import sys
    import time

    from edgesdk.agent.ota import UpdateState

    agent = StandInAgent(tmp_path / "dev-0", bundles, device_id="dev-0", broker_url=mqtt_broker.url)
    manager = updater_for(agent)
    manager.install_local(bundles.v1, timeout=60)
    db = tmp_path / "fleet.sqlite3"
    common = ["--broker", mqtt_broker.url, "--operator-key", str(bundles.operator_key), "--db", str(db)]
    push = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli.main", "fleet", "push", str(bundles.v2), "--devices", "dev-0",
         "--canary", "0%", "--waves", "100%", "--probation", "5m", "--deployment-id", "cli-2", "--json", *common],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and manager.state is not UpdateState.PROBATION:
            time.sleep(0.05)
        assert manager.state is UpdateState.PROBATION
        assert agent.server.running_model().release == 2
        abort = edgesdk_cli("fleet", "abort", "cli-2", *common)
        assert abort.returncode == 0, abort.stderr
        out, err = push.communicate(timeout=60)
        assert push.returncode == 1 and "cli-2 ABORTED" in err, err
        assert manager.wait_idle(30) and manager.state is UpdateState.ROLLED_BACK
        assert agent.server.running_model().release == 1
        assert json.loads(out)["state"] == "ABORTED"
    finally:
        push.kill()
        agent.link.stop()


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--devices", "a", "--canary", "150%"], ["--canary", "150%"]),
        (["--devices", "a", "--waves", "50%,10%"], ["--waves", "50%,10%"]),
        (["--devices", "a", "--probation", "soon"], ["--probation", "soon"]),
        (["--devices", "a", "--group", "g"], ["exactly one of --group"]),
        ([], ["exactly one of --group"]),
    ],
)
def test_push_bad_input_is_one_line(tmp_path: Path, bundles: OtaBundles, edgesdk_cli, extra, needles) -> None:
    proc = edgesdk_cli(
        "fleet", "push", str(bundles.v2), "--broker", "mqtt://127.0.0.1:9", "--db", str(tmp_path / "db"), *extra
    )
    assert_one_line_error(proc, *needles)


def test_missing_things_are_one_line(tmp_path: Path, bundles: OtaBundles, edgesdk_cli) -> None:
    db = ["--db", str(tmp_path / "fleet.sqlite3")]
    assert_one_line_error(edgesdk_cli("fleet", "status", "nope", *db), "'nope' not found")
    missing = edgesdk_cli(
        "fleet", "push", str(tmp_path / "none.edgepkg"), "--devices", "a", "--broker", "mqtt://127.0.0.1:9", *db
    )
    assert_one_line_error(missing, "none.edgepkg", "not found")
    no_key = edgesdk_cli("fleet", "push", str(bundles.v2), "--devices", "a", "--broker", "mqtt://127.0.0.1:9", *db)
    assert_one_line_error(no_key, "--operator-key")
    no_broker = edgesdk_cli(
        "fleet", "push", str(bundles.v2), "--devices", "a", "--broker", "mqtt://127.0.0.1:9",
        "--operator-key", str(bundles.operator_key), "--connect-timeout", "1", *db,
    )  # fmt: skip
    assert_one_line_error(no_broker, "127.0.0.1:9")
