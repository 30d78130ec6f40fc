"""The one private paho call edgesdk relies on (``edgesdk.mqtt.client.drop_connection``, which
uses ``paho.mqtt.client.Client._sock_close``) behaves as relied upon on the installed paho.
If a paho release renames it or changes what it does, this fails before a device does."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra (pip install 'edgesdk[agent]')")

import paho.mqtt.client as paho  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

from edgesdk.mqtt.client import drop_connection  # noqa: E402

_CONNECT_PACKET_TYPE = 0x10


def test_paho_still_has_the_private_close_call() -> None:
    assert callable(getattr(paho.Client, "_sock_close", None)), (
        f"paho {paho.__name__} no longer has Client._sock_close: rework edgesdk.mqtt.client.drop_connection"
    )


def test_drop_connection_closes_without_disconnect_and_fires_the_socket_callbacks() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="private-api-check")
    closed: list[object] = []
    unregistered: list[object] = []
    client.on_socket_close = lambda _c, _u, sock: closed.append(sock)
    client.on_socket_unregister_write = lambda _c, _u, sock: unregistered.append(sock)
    try:
        client.connect("127.0.0.1", server.getsockname()[1], keepalive=60)  # sends CONNECT, no loop needed
        peer, _ = server.accept()
        sock = client.socket()
        assert sock is not None
        drop_connection(client)
        # paho forgot the socket, told the loop (both callbacks, with that socket) and closed it.
        assert client.socket() is None
        assert closed == [sock]
        assert unregistered in ([sock], [])  # only fired when a write was registered; never another socket
        assert sock.fileno() == -1
        # The broker side sees the CONNECT and then the end of the stream: no DISCONNECT packet,
        # so a real broker would publish the Last Will.
        peer.settimeout(10)
        received = b""
        while chunk := peer.recv(4096):
            received += chunk
        assert received[0] == _CONNECT_PACKET_TYPE
        assert len(received) == received[1] + 2, received  # the CONNECT (short length byte) and nothing after
        peer.close()
    finally:
        server.close()
