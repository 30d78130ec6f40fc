"""Free local ports for the test's own servers, chosen together."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, every socket held open until all are chosen:
    one picked at a time, a later pick could be an earlier one (a CI run once gave a RabbitMQ
    node's AMQP listener the cluster's epmd port, and the node never started). Another process
    can still take one before the server binds it: a server started on these retries on new ones
    when it can (tests/shipped_mosquitto.py)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
