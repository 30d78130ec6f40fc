"""Capture files uploaded to the fleet service (issue 41) through real processes: a real
``edge-agent run`` with ``[capture] rate = 1.0`` and ``upload = true``, a real mosquitto, the
service process (``tests/fleet_service_process.py``, the ``FleetService`` of ``fleet serve``) on
SQLite. A served request's capture file arrives, is listed, downloads byte-identical to the file
on the device (the SHA-256 the device sent), leaves the device once stored (the dashboard's device page lists it to viewers, links and serves it to operators only)
and opens with ``edgesdk capture decrypt`` and the operator key (the service never
had it); an oversized upload is refused and counted, a forged one (bytes that do not match its
SHA-256) too. On the SHIPPED broker configuration a device cannot publish on another device's
capture topic."""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")
pytest.importorskip("onnxruntime")
httpx = pytest.importorskip("httpx")

from edgesdk.capture.upload import MAX_UPLOAD_BYTES, upload_message  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from tests.agent_helpers import AgentProcess  # noqa: E402
from tests.capture_helpers import (  # noqa: E402
    DEVICE_PASSWORDS,
    digits_device,
    get,
    ingest_counters,
    listed_captures,
    start_service,
    until,
    upload_config,
)
from tests.integration.conftest import require_mosquitto  # noqa: E402
from tests.pki_helpers import make_test_pki  # noqa: E402
from tests.shipped_mosquitto import shipped_broker, shipped_client  # noqa: E402

pytestmark = [pytest.mark.integration]


def test_an_agents_capture_file_is_uploaded_listed_and_downloads_to_what_the_operator_key_opens(
    digits, tmp_path: Path, request: Any
) -> None:
    require_mosquitto()
    device, operator_private, operator_public = digits_device(digits, tmp_path, request)
    image = np.load(digits.validation)["image"][:1].astype(np.float32)
    with MosquittoBroker(data_dir=tmp_path / "mosquitto") as broker:
        service, url, viewer, operator, db_url = start_service(tmp_path, broker)
        try:
            upload_config(device, broker, operator_public)
            with AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=30) as client:
                buffer = io.BytesIO()
                np.savez(buffer, image=image)
                answer = client.post(
                    "/v1/models/digits/infer",
                    content=buffer.getvalue(),
                    headers={"content-type": "application/x-npz"},
                )
                assert answer.status_code == 200, answer.text
                captures = until(lambda: listed_captures(url, viewer))
                assert captures, agent.log()[-3000:] + (tmp_path / "service.log").read_text()[-3000:]
                on_device = lambda: list((device.data_dir / "capture").glob("*.edgecap"))  # noqa: E731
                assert until(lambda: not on_device()), agent.log()[-3000:]  # deleted on the service's ack
            entry = captures[0]
            assert entry["model"] == "digits"

            assert get(f"{url}/api/v1/captures/{entry['id']}", viewer)[0] == 403  # operator role only
            status, downloaded = get(f"{url}/api/v1/captures/{entry['id']}", operator)
            local = downloaded  # the device's SHA-256 of its file, checked by the service on arrival:
            assert status == 200 and hashlib.sha256(local).hexdigest() == entry["sha256"]
            assert entry["size"] == len(local)
            assert get(f"{url}/api/v1/captures/{entry['id'] + 1000}", operator)[0] == 404
            _device_page_lists_captures_and_links_them_for_operators_only(url, viewer, operator, entry, local)

            saved = tmp_path / "downloaded.edgecap"
            saved.write_bytes(downloaded)
            opened = subprocess.run(
                [sys.executable, "-m", "edgesdk.cli.main", "capture", "decrypt", str(saved), "--json"]
                + ["--operator-key", str(operator_private), "--out", str(tmp_path / "plain")],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert opened.returncode == 0, opened.stderr
            np.testing.assert_array_equal(np.load(tmp_path / "plain" / "downloaded.npz")["in/image"], image)

            _refuses_oversized_and_forged_uploads(broker, url, viewer, db_url)
        finally:
            service.terminate()
            service.wait(30)


def _signed_in(url: str, token: str) -> Any:
    """An HTTP client holding a dashboard session for ``token`` (the sign-in form, as a browser)."""
    import re

    client = httpx.Client(base_url=url, timeout=30)
    csrf = re.search(r'name=csrf value="([^"]+)"', client.get("/login").text)
    assert csrf
    client.post("/login", data={"token": token, "csrf": csrf.group(1)})
    return client


def _device_page_lists_captures_and_links_them_for_operators_only(
    url: str, viewer: str, operator: str, entry: dict[str, Any], local: bytes
) -> None:
    """The device page lists the capture (model, size, SHA-256) to both roles; only the operator's
    page links it, and only the operator's session downloads it (the viewer's gets 403)."""
    link = f"/ui/captures/{entry['id']}"
    watcher, otto = _signed_in(url, viewer), _signed_in(url, operator)
    try:
        seen = watcher.get("/ui/devices/dev-1").text
        assert f'id="capture-{entry["id"]}"' in seen and entry["sha256"] in seen, seen[-3000:]
        assert f"{entry['size']:,} B" in seen and ">digits<" in seen
        assert link not in seen
        assert watcher.get(link).status_code == 403
        page = otto.get("/ui/devices/dev-1").text
        assert f'href="{link}"' in page
        download = otto.get(link)
        assert download.status_code == 200 and download.content == local
        assert entry["name"] in download.headers["content-disposition"]
        assert otto.get(f"/ui/captures/{entry['id'] + 1000}").status_code == 404
    finally:
        watcher.close()
        otto.close()
    assert httpx.get(url + link, timeout=30).status_code in (302, 303, 307)  # no session: to the sign-in page


def _refuses_oversized_and_forged_uploads(broker: MosquittoBroker, url: str, viewer: str, db_url: str) -> None:
    """A device's upload over the size cap, and one whose bytes are not what its SHA-256 says, are
    counted and never listed; a genuine one after them is (the stream goes on)."""
    sender = MqttClient(ClientOptions(client_id="dev-1-impostor", broker_url=broker.url))
    sender.start()
    try:
        assert sender.wait_connected(60), sender.stats.last_error
        topic = "edgesdk/devices/dev-1/capture"
        whole = b"x" * (MAX_UPLOAD_BYTES + 1)  # as one message (count 1), more than one carries
        big = upload_message("dev-1", "20261205T000000.000000Z-000001-digits.edgecap", "digits", whole)
        big = big.model_copy(update={"count": 1, "data": base64.b64encode(whole).decode()})
        sender.publish(topic, big.model_dump_json().encode(), qos=1)
        genuine = upload_message("dev-1", "20261205T000000.000000Z-000002-digits.edgecap", "digits", b"sealed")
        forged = genuine.model_copy(update={"data": base64.b64encode(b"changed").decode(), "name": "forged.edgecap"})
        sender.publish(topic, forged.model_dump_json().encode(), qos=1)
        sender.publish(topic, genuine.model_dump_json().encode(), qos=1)

        def names() -> set[str]:
            return {c["name"] for c in listed_captures(url, viewer)}

        assert until(lambda: genuine.name in names())
        assert big.name not in names() and "forged.edgecap" not in names()
        # Both counted before the genuine one is stored, but a periodic flush of the counters can
        # fall between the two: wait for both in the database, not just the first.
        counters = until(lambda: (c := ingest_counters(db_url)).get("capture_refused") and c.get("malformed") and c, 60)
        assert counters["capture_refused"] == 1 and counters["malformed"] >= 1, counters
        metrics = until(lambda: (text := get(f"{url}/metrics", viewer)[1].decode()) and text)
        assert 'edgesdk_fleet_ingest_total{kind="capture_refused"} 1' in metrics, metrics[-2000:]
    finally:
        sender.stop()


def test_the_shipped_acl_lets_a_device_upload_captures_only_on_its_own_topic(tmp_path: Path) -> None:
    require_mosquitto()
    pki = make_test_pki(tmp_path / "pki", ["rpi-001", "rpi-002", "fleet-operator"])
    with shipped_broker(tmp_path / "broker", pki, DEVICE_PASSWORDS) as broker:
        service = shipped_client(broker, "operators", "service", "fleet-operator", "op")
        seen: list[tuple[str, bytes]] = []
        service.on_message = lambda topic, payload: seen.append((topic, payload))
        service.subscribe("edgesdk/devices/+/capture", qos=1)
        attacker = shipped_client(broker, "devices", "rpi-002", "rpi-002", DEVICE_PASSWORDS["rpi-002"])
        try:
            for client in (service, attacker):
                client.start()
                assert client.wait_connected(60), client.stats.last_error
            time.sleep(0.3)
            attacker.publish("edgesdk/devices/rpi-001/capture", b"forged", qos=1)
            attacker.publish("edgesdk/devices/rpi-002/capture", b"genuine", qos=1)
            assert until(lambda: ("edgesdk/devices/rpi-002/capture", b"genuine") in seen, 60)
            assert [t for t, p in seen if p == b"forged"] == []
        finally:
            service.stop()
            attacker.stop()
