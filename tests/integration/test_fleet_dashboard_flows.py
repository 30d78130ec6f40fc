"""The dashboard an operator works in (issue 40), through one real ``edgesdk fleet serve``
process over a real mosquitto, driven by Debian's Chromium through Playwright (never
``playwright install``). One service and one browser for the module (CI time).

Devices speak as agents do: retained presence and enrollment requests published to the broker.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from tests.integration.conftest import require_mosquitto  # noqa: E402

pytestmark = [pytest.mark.integration]

EDGESDK = [sys.executable, "-m", "edgesdk.cli.main"]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync"]


@dataclass
class Dashboard:
    api: str
    broker: MosquittoBroker
    operator: str  # token
    viewer: str
    admin: str
    root: Path
    device: MqttClient  # publishes as the devices do


def _token(data_dir: Path, role: str) -> str:
    made = subprocess.run(
        [*EDGESDK, "fleet", "serve", "token", "create", "--role", role, "--name", role, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: Any) -> Iterator[Dashboard]:
    require_mosquitto()
    from edgesdk.keys import generate_publisher_key

    root = tmp_path_factory.mktemp("dashboard-flows")
    data = root / "data"
    operator, viewer, admin = _token(data, "operator"), _token(data, "viewer"), _token(data, "admin")
    operator_key, _ = generate_publisher_key(root / "operator")
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_FLEET")} | {"HOME": str(root)}
        argv = [*EDGESDK, "fleet", "serve", "--broker", broker.url, "--operator-key", str(operator_key)]
        argv += ["--api", "127.0.0.1:0", "--data-dir", str(data)]
        with open(root / "serve.log", "w") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            device = MqttClient(ClientOptions(client_id="dashboard-test-devices", broker_url=broker.url))
            try:
                assert proc.stdout is not None
                banner = proc.stdout.readline()
                api = re.search(r"API on (http://\S+)", banner)
                assert api, banner + (root / "serve.log").read_text()[-2000:]
                device.start()
                assert device.wait_connected(60), device.stats.last_error
                yield Dashboard(api.group(1), broker, operator, viewer, admin, root, device)
            finally:
                device.stop()
                proc.terminate()
                proc.wait(60)


@pytest.fixture(scope="module")
def browser(dashboard: Dashboard) -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).is_file():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def signed_in(browser: Any, dashboard: Dashboard, token: str) -> Any:
    """A fresh browser context (its own cookies) signed in with ``token``, on the overview."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(20_000)
    page.goto(dashboard.api + "/")
    page.fill("#token", token)
    with page.expect_navigation():
        page.click("#sign-in")
    return page


def publish_presence(dashboard: Dashboard, device_id: str, *, online: bool, groups: list[str] | None = None) -> None:
    from edgesdk.schemas.messages import Presence

    presence = Presence(device_id=device_id, online=online, ts=datetime.now(UTC), groups=groups or ["line-1"])
    info = dashboard.device.publish(
        f"edgesdk/devices/{device_id}/presence", presence.model_dump_json().encode(), qos=1, retain=True
    )
    assert info is not None


def session_cookie(dashboard: Dashboard, token: str) -> str:
    """Sign in the way the browser does (login page's CSRF pair) and return the session cookie."""
    url = urllib.parse.urlsplit(dashboard.api)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", "/login")
    page = conn.getresponse()
    html = page.read().decode()
    login = next(c for c in page.headers.get_all("set-cookie") or [] if c.startswith("edgesdk_fleet_login="))
    csrf = re.search(r'name=csrf value="([^"]+)"', html)
    assert csrf, html
    body = urllib.parse.urlencode({"csrf": csrf.group(1), "token": token})
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": login.split(";", 1)[0]}
    conn.request("POST", "/login", body=body, headers=headers)
    answer = conn.getresponse()
    answer.read()
    conn.close()
    session = next(c for c in answer.headers.get_all("set-cookie") or [] if c.startswith("edgesdk_fleet_session="))
    return session.split(";", 1)[0]


def open_stream(dashboard: Dashboard, cookie: str | None) -> tuple[http.client.HTTPConnection, Any]:
    url = urllib.parse.urlsplit(dashboard.api)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    conn.request("GET", "/ui/events", headers={"Cookie": cookie} if cookie else {})
    return conn, conn.getresponse()


# -- live by server-sent events --------------------------------------------------------------


def test_a_device_state_change_appears_on_the_overview_without_a_reload(browser: Any, dashboard: Dashboard) -> None:
    page = signed_in(browser, dashboard, dashboard.operator)
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    # "aa-": first by id, so on the overview (which lists 50) whatever other tests made first
    publish_presence(dashboard, "aa-live-1", online=True)
    page.locator("#device-aa-live-1 .presence .ok").wait_for()
    publish_presence(dashboard, "aa-live-1", online=False)
    page.locator("#device-aa-live-1 .presence .bad").wait_for()
    page.locator("#alerts li.bad", has_text="aa-live-1 is offline").wait_for()
    assert navigations == [], f"the page reloaded instead of updating in place: {navigations}"
    page.context.close()


def test_the_live_stream_needs_a_session_is_bounded_and_ends_at_sign_out(dashboard: Dashboard) -> None:
    _conn, anonymous = open_stream(dashboard, None)
    assert anonymous.status == 401
    cookie = session_cookie(dashboard, dashboard.viewer)
    streams = [open_stream(dashboard, cookie) for _ in range(4)]
    assert [r.status for _c, r in streams] == [200] * 4
    assert streams[0][1].getheader("content-type", "").startswith("text/event-stream")
    assert "retry:" in streams[0][1].readline().decode()
    _conn, fifth = open_stream(dashboard, cookie)
    assert fifth.status == 429 and "at most 4" in fifth.read().decode()
    url = urllib.parse.urlsplit(dashboard.api)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    conn.request("GET", "/logout", headers={"Cookie": cookie})
    conn.getresponse().read()
    started = time.monotonic()
    for _c, response in streams:
        text = response.read().decode()  # the server ends the stream: read() returns
        assert "event: end" in text, text
    assert time.monotonic() - started < 10


# -- pending enrollment ----------------------------------------------------------------------


def request_enrollment(dashboard: Dashboard, device_id: str) -> str:
    """Publish a device's retained enrollment request, as its agent does; its full key id."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.enrollment import enrollment_request

    message = enrollment_request(device_id, X25519PrivateKey.generate().public_key().public_bytes_raw())
    dashboard.device.publish(
        f"edgesdk/devices/{device_id}/enroll", message.model_dump_json().encode(), qos=1, retain=True
    )
    return message.key_id


def enrollment_status(dashboard: Dashboard, device_id: str) -> dict[str, Any]:
    import json
    import urllib.request

    call = urllib.request.Request(
        f"{dashboard.api}/api/v1/enrollment?limit=500", headers={"Authorization": f"Bearer {dashboard.viewer}"}
    )
    with urllib.request.urlopen(call, timeout=20) as answer:
        items = json.loads(answer.read())["items"]
    return next(i for i in items if i["device_id"] == device_id)


def test_an_operator_approves_and_rejects_pending_enrollments_by_their_full_key_id(
    browser: Any, dashboard: Dashboard
) -> None:
    keys = {device_id: request_enrollment(dashboard, device_id) for device_id in ("enr-a", "enr-b")}
    viewer = signed_in(browser, dashboard, dashboard.viewer)
    viewer.goto(dashboard.api + "/ui/enrollment")
    viewer.locator("#pending-enr-b").wait_for()  # arrives live when the ingest has it
    assert keys["enr-a"] in viewer.inner_text("#pending-enr-a .key-id")  # the full 32 digits
    assert viewer.locator("#pending button").count() == 0, "a viewer sees no approve/reject buttons"
    viewer.context.close()

    page = signed_in(browser, dashboard, dashboard.operator)
    page.goto(dashboard.api + "/ui/enrollment")
    with page.expect_navigation():
        page.click("#approve-enr-a")
    assert f"enr-a approved (key {keys['enr-a']})" in page.inner_text("#enrollment-done")
    with page.expect_navigation():
        page.click("#reject-enr-b")
    assert page.locator("#pending-enr-a").count() == 0 and page.locator("#pending-enr-b").count() == 0
    approved, rejected = enrollment_status(dashboard, "enr-a"), enrollment_status(dashboard, "enr-b")
    assert (approved["status"], approved["key_id"]) == ("approved", keys["enr-a"])
    assert rejected["status"] == "revoked"
    page.context.close()


def test_an_enrollment_approval_is_bound_to_the_key_id_the_page_showed(browser: Any, dashboard: Dashboard) -> None:
    first = request_enrollment(dashboard, "enr-c")
    page = signed_in(browser, dashboard, dashboard.operator)
    page.goto(dashboard.api + "/ui/enrollment")
    page.locator("#pending-enr-c").wait_for()
    later = request_enrollment(dashboard, "enr-c")  # another key announced (the bootstrap account can)
    page.locator("#pending-enr-c", has_text=later).wait_for()  # shown live beside the first, in full
    csrf = page.locator("#pending-enr-c input[name=csrf]").first.get_attribute("value")
    forged = page.request.post(
        dashboard.api + "/ui/enrollment/enr-c/approve", form={"csrf": csrf, "key_id": "ab" * 16}, max_redirects=0
    )
    assert forged.status == 303 and "error=" in forged.headers["location"]
    assert enrollment_status(dashboard, "enr-c")["status"] == "pending"
    with page.expect_navigation():
        page.click("#approve-enr-c")  # the button names the first key, and approves that one
    assert (enrollment_status(dashboard, "enr-c")["status"], enrollment_status(dashboard, "enr-c")["key_id"]) == (
        "approved",
        first,
    )
    page.context.close()


# -- the devices page ------------------------------------------------------------------------


def put_tag(dashboard: Dashboard, device_id: str, key: str, value: str) -> None:
    import json
    import urllib.request

    call = urllib.request.Request(
        f"{dashboard.api}/api/v1/devices/{device_id}/tags/{key}",
        data=json.dumps({"value": value}).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {dashboard.operator}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(call, timeout=20) as answer:
        assert answer.status == 200


def test_devices_are_searched_filtered_sorted_and_paged_by_the_server(browser: Any, dashboard: Dashboard) -> None:
    from edgesdk.schemas.messages import Presence

    def announce(i: int, online: bool) -> None:
        presence = Presence(
            device_id=f"fleet-{i:03d}",
            online=online,
            ts=datetime.now(UTC),
            groups=["line-b" if i % 2 else "line-a"],
            profile="rpi5-8gb" if i % 3 else "pi-zero-2w",
        )
        dashboard.device.publish(f"edgesdk/devices/fleet-{i:03d}/presence", presence.model_dump_json().encode(), qos=1)

    for i in range(55):
        announce(i, True)
    for i in range(0, 55, 5):
        announce(i, False)  # went away (a device's last will)
    page = signed_in(browser, dashboard, dashboard.operator)
    page.goto(dashboard.api + "/ui/devices?q=fleet-")
    page.locator("#page-info", has_text="of 55 ").wait_for()  # live: rows arrive as the ingest has them
    assert page.locator("#device-table tr[id^=row-]").count() == 50
    with page.expect_navigation():
        page.click("#next-page")
    assert page.locator("#device-table td.device").all_inner_texts() == [f"fleet-{i:03d}" for i in range(50, 55)]
    with page.expect_navigation():
        page.click("#sort-device")  # sorted by device already: the click turns the order round
    assert page.locator("#device-table td.device").first.inner_text() == "fleet-054"
    assert "page 1 of 2" in page.inner_text("#page-info")

    page.fill("#filter-group", "line-b")
    page.select_option("#filter-state", "offline")
    page.fill("#filter-profile", "rpi5-8gb")
    with page.expect_navigation():
        page.click("#apply-filters")
    expected = [f"fleet-{i:03d}" for i in range(54, -1, -1) if i % 2 and i % 5 == 0 and i % 3]
    assert page.locator("#device-table td.device").all_inner_texts() == expected

    put_tag(dashboard, "fleet-007", "site", "lab-3")
    page.goto(dashboard.api + "/ui/devices?q=site%3Dlab")
    assert page.locator("#device-table td.device").all_inner_texts() == ["fleet-007"]

    answer = page.goto(dashboard.api + "/ui/devices?sort=banana")
    assert answer is not None and answer.status == 400
    assert "sort 'banana' is not one of device" in page.inner_text("#query-error")
    page.context.close()


# -- alerts with acknowledge -----------------------------------------------------------------


def test_an_operator_acknowledges_an_alert_and_a_new_occurrence_is_red_again(
    browser: Any, dashboard: Dashboard
) -> None:
    publish_presence(dashboard, "ack-1", online=True)
    time.sleep(1.0)  # a later last_seen for the second occurrence below
    publish_presence(dashboard, "ack-1", online=False)
    viewer = signed_in(browser, dashboard, dashboard.viewer)
    viewer.goto(dashboard.api + "/ui/alerts")
    viewer.locator("#alerts li.bad", has_text="ack-1 is offline").wait_for()
    assert viewer.locator("#alerts .ack-button").count() == 0, "a viewer cannot acknowledge"
    viewer.context.close()

    page = signed_in(browser, dashboard, dashboard.operator)
    page.goto(dashboard.api + "/ui/alerts")
    alert = page.locator("#alerts li", has_text="ack-1 is offline")
    with page.expect_navigation():
        alert.locator(".ack-button").click()
    acked = page.locator("#alerts li.acked", has_text="ack-1 is offline")
    assert "acknowledged by operator" in acked.inner_text()
    page.goto(dashboard.api + "/")
    assert page.locator("#alerts li.acked", has_text="ack-1 is offline").count() == 1  # grey on the overview too

    time.sleep(1.0)
    publish_presence(dashboard, "ack-1", online=True)
    page.locator("#device-ack-1 .presence .ok").wait_for()
    publish_presence(dashboard, "ack-1", online=False)  # gone again: a new occurrence
    page.locator("#alerts li.bad", has_text="ack-1 is offline").wait_for()
    assert page.locator("#alerts li.acked", has_text="ack-1").count() == 0
    page.context.close()


# -- audit log and artifacts -----------------------------------------------------------------


def rest(dashboard: Dashboard, method: str, path: str, token: str, body: Any = None, raw: bytes | None = None) -> Any:
    """One REST call; (status, JSON answer)."""
    import json
    import urllib.error
    import urllib.request

    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    kind = "application/octet-stream" if raw is not None else "application/json"
    call = urllib.request.Request(
        dashboard.api + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": kind},
    )
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_audit_log_view_pages_and_filters_by_actor_and_action(browser: Any, dashboard: Dashboard) -> None:
    for i in range(55):  # refused writes are in the audit log too
        status, _ = rest(dashboard, "PUT", f"/api/v1/devices/audit-{i}/tags/site", dashboard.viewer, {"value": "x"})
        assert status == 403
    viewer = signed_in(browser, dashboard, dashboard.viewer)
    answer = viewer.goto(dashboard.api + "/ui/audit")
    assert answer is not None and answer.status == 403 and "needs the admin role" in viewer.inner_text("#audit-error")
    viewer.context.close()

    page = signed_in(browser, dashboard, dashboard.admin)
    page.goto(dashboard.api + "/ui/audit")
    page.fill("#audit-actor", "viewer")
    page.fill("#audit-action", "device.tag")
    with page.expect_navigation():
        page.click("#audit-apply")
    assert "55 entries · page 1 of 2" in page.inner_text("#audit-page-info")
    assert page.locator("#audit .audit-entry").count() == 50
    assert set(page.locator("#audit .outcome").all_inner_texts()) == {"refused"}
    with page.expect_navigation():
        page.click("#audit-next")
    assert page.locator("#audit .audit-entry").count() == 5
    assert {t.split(" ")[0] for t in page.locator("#audit .actor").all_inner_texts()} == {"viewer"}
    page.context.close()


def test_the_artifacts_page_shows_size_model_and_the_rollouts_using_a_bundle(
    browser: Any, dashboard: Dashboard
) -> None:
    from tests.bundle_helpers import make_keys, placeholder_bundle

    bundle = placeholder_bundle(dashboard.root / "artifact", make_keys(dashboard.root / "artifact-keys"))
    status, stored = rest(dashboard, "POST", "/api/v1/bundles", dashboard.operator, raw=bundle.read_bytes())
    assert status == 201, stored
    publish_presence(dashboard, "art-1", online=True)
    page = signed_in(browser, dashboard, dashboard.viewer)
    page.goto(dashboard.api + "/ui/devices?q=art-1")
    page.locator("#row-art-1").wait_for()  # live: the device arrives as the ingest has it
    status, made = rest(
        dashboard, "POST", "/api/v1/deployments", dashboard.operator,
        {"bundle_id": stored["id"], "devices": ["art-1"], "deployment_id": "art-rollout", "canary": 0},
    )  # fmt: skip
    assert status == 201, made
    page.goto(dashboard.api + "/ui/artifacts")
    row = page.locator(f"#artifact-{stored['id']}")
    assert row.locator(".size").inner_text().endswith("KiB")
    assert "digits 1.0.0 (release 1)" in row.inner_text()
    assert row.locator(".users").inner_text() == "art-rollout running"
    rest(dashboard, "POST", "/api/v1/deployments/art-rollout/abort", dashboard.operator, {"reason": "test over"})
    page.context.close()


# -- the rollout page ------------------------------------------------------------------------


def test_the_rollout_page_shows_wave_progress_the_probation_countdown_and_why_the_canary_is_two(
    browser: Any, dashboard: Dashboard
) -> None:
    from edgesdk.schemas.messages import OtaStatus
    from tests.bundle_helpers import make_keys, placeholder_bundle

    bundle = placeholder_bundle(dashboard.root / "rollout-page", make_keys(dashboard.root / "rollout-page-keys"))
    status, stored = rest(dashboard, "POST", "/api/v1/bundles", dashboard.operator, raw=bundle.read_bytes())
    assert status in (200, 201), stored
    devices = ["rp-1", "rp-2", "rp-3"]
    for device_id in devices:
        publish_presence(dashboard, device_id, online=True)
    page = signed_in(browser, dashboard, dashboard.operator)
    page.goto(dashboard.api + "/ui/devices?q=rp-")
    page.locator("#page-info", has_text="of 3 ").wait_for()  # the overview lists only the first 50
    body = {"bundle_id": stored["id"], "devices": devices, "deployment_id": "rp-rollout", "canary": 0.34}
    status, made = rest(dashboard, "POST", "/api/v1/deployments", dashboard.operator, body | {"probation_s": 900})
    assert status == 201, made
    page.goto(dashboard.api + "/ui/deployments/rp-rollout")
    note = page.inner_text("#canary-note")
    assert "canary 34% of 3 devices is 1.02, rounded up to 2 devices" in note, note
    assert page.locator(".wave-progress progress").count() == 2
    canary = page.locator(".wave").first.locator("tr[id^=dd-]").evaluate_all("rows => rows.map(r => r.id)")
    first = canary[0].removeprefix("dd-")
    report = OtaStatus(
        device_id=first, deployment_id="rp-rollout", msg_id="rp-p", ts=datetime.now(UTC), state="PROBATION"
    )
    dashboard.device.publish(f"edgesdk/devices/{first}/ota/status", report.model_dump_json().encode(), qos=1)
    countdown = page.locator(".wave-progress .countdown").first
    countdown.wait_for()  # live: the device's state arrives by the event stream
    assert 850 <= int(countdown.inner_text().removesuffix(" s")) <= 900
    assert "0 of 2 committed" in page.locator(".wave-progress").first.inner_text()
    rest(dashboard, "POST", "/api/v1/deployments/rp-rollout/abort", dashboard.operator, {"reason": "test over"})
    page.context.close()
