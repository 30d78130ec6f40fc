"""The mosquitto launcher used by every MQTT test, the demo and the benchmarks."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import BrokerTls, MosquittoBroker
from tests.integration.conftest import require_mosquitto
from tests.pki_helpers import make_test_pki


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_broker_starts_stops_and_restarts_on_the_same_port(mqtt_broker: MosquittoBroker) -> None:
    port = mqtt_broker.port
    assert port > 0 and mqtt_broker.url == f"mqtt://127.0.0.1:{port}"
    assert _accepts(port)
    mqtt_broker.stop()
    assert not _accepts(port)
    mqtt_broker.restart()
    assert mqtt_broker.port == port and _accepts(port)


def test_tls_listener_presents_a_server_cert_the_test_ca_verifies(tmp_path: Path) -> None:
    require_mosquitto()
    pki = make_test_pki(tmp_path / "pki", ["dev-1"])
    tls = BrokerTls(pki.ca_file, pki.server_cert, pki.server_key, require_certificate=True)
    with MosquittoBroker(tls=tls, data_dir=tmp_path / "broker") as broker:
        assert broker.url.startswith("mqtts://")
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.load_cert_chain(str(pki.clients["dev-1"].cert_file), str(pki.clients["dev-1"].key_file))
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
                assert wrapped.version() is not None
        # A client that does not trust our CA refuses the broker.
        untrusting = ssl.create_default_context()
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                untrusting.wrap_socket(raw, server_hostname="127.0.0.1")
