"""Tags, dynamic groups and webhooks through a real ``edgesdk fleet serve`` (issue 40): a real
mosquitto, devices announced by real retained presences, the real CLI (``fleet tag``, ``fleet
filter save``, ``fleet webhook add``, ``fleet submit --where``), the REST API for a rollout to a
saved filter, and real HTTP receivers checking every delivery's HMAC signature: a rollout's
state changes and a device going offline reach the receiver; a receiver that is down is retried
and then recorded as failed; bad input is one line without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_fleet_web_and_enrollment_identity import fleet_serve, token
from tests.mqtt_helpers import wait_acked
from tests.webhook_receiver import closed_port, running_receiver

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

pytestmark = [pytest.mark.integration]

EDGESDK = [sys.executable, "-m", "edgesdk.cli.main"]
SECRET = "integration-webhook-secret"


def _presence(broker_url: str, device_id: str, *, online: bool, profile: str) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    client = MqttClient(ClientOptions(client_id=f"presence-{device_id}", broker_url=broker_url))
    client.start()
    assert client.wait_connected(60), client.stats.last_error
    now = datetime.now(timezone.utc).isoformat()
    presence = {"device_id": device_id, "online": online, "ts": now, "profile": profile, "groups": ["line-1"]}
    client.publish(f"edgesdk/devices/{device_id}/presence", json.dumps(presence).encode(), qos=1, retain=True)
    wait_acked(client)  # stored by the broker before the disconnect
    client.stop()


def _notifier_watching(broker_url: str, receiver: Any) -> None:
    """Until the service's webhook notifier has taken its first look at the fleet: it reports the
    changes since that look, so a rollout started before it would go unreported. A probe device
    is flipped offline and online until an alert about it is delivered (a flip that came before
    the first look is part of what that look saw, so one flip is not enough)."""
    deadline = time.monotonic() + 60
    online = False
    while not any(b'"probe-1"' in body for _, body in list(receiver.got)):
        assert time.monotonic() < deadline, "the webhook notifier reported no change in 60 s"
        _presence(broker_url, "probe-1", online=online, profile="x86")
        online = not online
        flipped = time.monotonic()
        while time.monotonic() - flipped < 3 and not any(b'"probe-1"' in body for _, body in list(receiver.got)):
            time.sleep(0.1)


def _api(base: str, secret: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{base}/api/v1{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - the test's own service
        return json.loads(answer.read())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGESDK, "fleet", *args], capture_output=True, text=True, timeout=120)


def _until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_tags_filters_and_signed_webhooks_through_fleet_serve(mqtt_broker, tmp_path: Path, monkeypatch) -> None:
    from edgesdk.fleet.service import webhooks
    from tests.bundle_helpers import make_keys, placeholder_bundle

    monkeypatch.setenv(webhooks.ATTEMPTS_ENV, "2")
    monkeypatch.setenv(webhooks.BACKOFF_ENV, "0.2")
    data = tmp_path / "data"
    operator, admin = token(data, "operator"), token(data, "admin")
    (tmp_path / "operator.token").write_text(operator)
    (tmp_path / "admin.token").write_text(admin)
    (tmp_path / "secret").write_text(SECRET)
    with fleet_serve(tmp_path / "svc", ["--broker", mqtt_broker.url], "--data-dir", str(data)) as svc:
        as_operator = ["--server", svc.api, "--token-file", str(tmp_path / "operator.token")]
        as_admin = ["--server", svc.api, "--token-file", str(tmp_path / "admin.token")]
        _presence(mqtt_broker.url, "cam-1", online=True, profile="pi5")
        _presence(mqtt_broker.url, "cam-2", online=True, profile="x86")
        _until("two devices", lambda: _api(svc.api, operator, "GET", "/devices")["total"] == 2)

        tagged = _cli("tag", "cam-1", "site=berlin", "rack=7", *as_operator)
        assert tagged.returncode == 0 and "berlin" in tagged.stdout, tagged.stderr
        assert _cli("tag", "cam-2", "site=berlin", *as_operator).returncode == 0
        bad = _cli("tag", "cam-1", "site", *as_operator)
        assert bad.returncode != 0 and "'site'" in bad.stderr and "Traceback" not in bad.stderr
        saved = _cli("filter", "save", "berlin-pi5", "tag.site=berlin and profile=pi5", *as_operator)
        assert saved.returncode == 0 and "cam-1" in saved.stdout and "cam-2" not in saved.stdout, saved.stdout
        wrong = _cli("filter", "save", "x", "tag.site=berlin or profile=pi5", *as_operator)
        assert wrong.returncode != 0 and "'or'" in wrong.stderr and "Traceback" not in wrong.stderr

        with running_receiver() as receiver:
            refused = _cli(
                "webhook", "add", "http://169.254.169.254/latest", "--secret-file", str(tmp_path / "secret"), *as_admin
            )
            assert refused.returncode != 0 and "169.254.169.254" in refused.stderr and "Traceback" not in refused.stderr
            added = _cli("webhook", "add", receiver.url, "--secret-file", str(tmp_path / "secret"), *as_admin)
            assert added.returncode == 0, added.stderr
            dead = _cli(
                "webhook",
                "add",
                f"http://127.0.0.1:{closed_port()}/",
                "--secret-file",
                str(tmp_path / "secret"),
                "--event",
                "rollout.",
                "--json",
                *as_admin,
            )
            assert dead.returncode == 0, dead.stderr
            listed = _cli("webhook", "list", "--json", *as_admin)
            assert listed.returncode == 0 and SECRET not in listed.stdout
            _notifier_watching(mqtt_broker.url, receiver)

            bundle = placeholder_bundle(tmp_path / "bundle", make_keys(tmp_path / "keys"))
            request = urllib.request.Request(
                f"{svc.api}/api/v1/bundles?filename=digits.edgepkg",
                data=bundle.read_bytes(),
                method="POST",
                headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/octet-stream"},
            )
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
                bundle_id = json.loads(answer.read())["id"]
            rollout = {"bundle_id": bundle_id, "target_filter": "berlin-pi5", "canary": 0, "waves": [1.0]}
            created = _api(svc.api, operator, "POST", "/deployments", {**rollout, "deployment_id": "berlin-1"})
            assert created["devices"] == 1, created
            headers, body = receiver.wait_for("rollout.in_progress", about=b"berlin-1", timeout=60)
            assert webhooks.verify(SECRET, headers["X-Edgesdk-Timestamp"], body, headers["X-Edgesdk-Signature"])
            _api(svc.api, operator, "POST", "/deployments/berlin-1/abort", {"reason": "test"})
            receiver.wait_for("rollout.aborted", about=b"berlin-1", timeout=60)

            submitted = _cli(
                "submit",
                str(bundle),
                "--data-dir",
                str(data),
                "--where",
                "tag.site=berlin and profile=x86",
                "--deployment-id",
                "sub-1",
                "--json",
            )
            assert submitted.returncode == 0 and json.loads(submitted.stdout)["devices"] == 1, submitted.stderr
            standalone = _cli("push", str(bundle), "--where", "profile=x86", "--broker", mqtt_broker.url)
            assert standalone.returncode != 0 and "need --server" in standalone.stderr, standalone.stderr

            _presence(mqtt_broker.url, "cam-2", online=False, profile="x86")  # its Last Will
            headers, body = receiver.wait_for("alert.firing", about=b'"cam-2"', timeout=60)
            assert webhooks.verify(SECRET, headers["X-Edgesdk-Timestamp"], body, headers["X-Edgesdk-Signature"])

            dead_id = json.loads(dead.stdout)["id"]
            failed = _until(
                "the dead receiver's failure",
                lambda: [
                    d
                    for d in _api(svc.api, admin, "GET", f"/webhooks/{dead_id}/deliveries")["items"]
                    if d["outcome"] == "failed"
                ],
            )
            assert failed[0]["attempts"] == 2 and failed[0]["event"].startswith("rollout."), failed


def _window_closed_now() -> str:
    """A one-hour UTC window that starts two hours from now (so it is closed now)."""
    opens = datetime.now(timezone.utc) + timedelta(hours=2)
    return f"{opens:%H}:00-{(opens + timedelta(hours=1)):%H}:00"


def test_scheduled_start_and_maintenance_window_hold_the_waves_through_fleet_serve(
    mqtt_broker, tmp_path: Path, monkeypatch
) -> None:
    from tests.bundle_helpers import make_keys, placeholder_bundle

    monkeypatch.setenv("EDGESDK_FLEET_TIMEZONE", "UTC")
    data = tmp_path / "data"
    operator = token(data, "operator")
    (tmp_path / "operator.token").write_text(operator)
    with fleet_serve(tmp_path / "svc", ["--broker", mqtt_broker.url], "--data-dir", str(data)) as svc:
        as_operator = ["--server", svc.api, "--token-file", str(tmp_path / "operator.token")]
        _presence(mqtt_broker.url, "cam-1", online=True, profile="pi5")
        _until("the device", lambda: _api(svc.api, operator, "GET", "/devices")["total"] == 1)
        bundle = placeholder_bundle(tmp_path / "bundle", make_keys(tmp_path / "keys"))
        later = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%MZ")
        common = ["--devices", "cam-1", "--canary", "0", "--waves", "100%", "--data-dir", str(data), "--json"]
        assert _cli("submit", str(bundle), *common, "--deployment-id", "tomorrow", "--start-at", later).returncode == 0
        window = _window_closed_now()
        closed = _cli("submit", str(bundle), *common, "--deployment-id", "in-window", "--window", window)
        assert closed.returncode == 0, closed.stderr
        everywhen = _cli("submit", str(bundle), *common, "--deployment-id", "now", "--window", "00:00-23:59")
        assert everywhen.returncode == 0, everywhen.stderr

        grouped = _cli("window", "set", "line-1", window, "--window-tz", "UTC", *as_operator)
        assert grouped.returncode == 0 and window in grouped.stdout, grouped.stderr
        by_group = [*common[2:], "--group", "line-1", "--deployment-id", "group-window"]  # no --window of its own
        assert _cli("submit", str(bundle), *by_group).returncode == 0
        assert _cli("window", "set", "line-1", "2-4", *as_operator).returncode != 0

        def states(deployment_id: str) -> dict[str, Any]:
            return _api(svc.api, operator, "GET", f"/deployments/{deployment_id}")

        waiting = _until("the scheduled rollout's status", lambda: states("tomorrow")["reason"] or None)
        assert waiting == f"scheduled: waiting for its start at {later}"
        held = _until("the window's status", lambda: states("in-window")["reason"] or None)
        assert held.startswith(f"waiting for its maintenance window {window} (UTC, opens in 1h"), held
        _until("the open window's wave sent", lambda: states("now")["device_states"][0]["state"] != "PENDING")
        by_window = _until("the group window's status", lambda: states("group-window")["reason"] or None)
        assert by_window.startswith(f"waiting for its maintenance window {window} (UTC"), by_window
        for deployment_id in ("tomorrow", "in-window", "group-window"):
            detail = states(deployment_id)
            assert detail["state"] == "PENDING" and detail["device_states"][0]["state"] == "PENDING", detail
        shown = _cli("status", "tomorrow", *as_operator)
        assert shown.returncode == 0 and f"waiting for its start at {later}" in shown.stdout, shown.stdout
        bad = _cli("submit", str(bundle), *common, "--window", "25:00-02:00")
        assert bad.returncode != 0 and "'25:00-02:00'" in bad.stderr and "Traceback" not in bad.stderr
        naive = _cli("submit", str(bundle), *common, "--start-at", "2026-12-06T02:00")
        assert naive.returncode != 0 and "zone" in naive.stderr and "Traceback" not in naive.stderr
        _api(svc.api, operator, "POST", "/deployments/tomorrow/abort", {"reason": "not needed"})
        assert states("tomorrow")["state"] == "ABORTED"
