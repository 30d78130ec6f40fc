"""Enrollment on the device: announce the device's own public key so the operator can approve it.

The key pair itself is made by the agent on first start (``Agent.device_key``, private key
0600 in the state directory; it never leaves the device). This module only builds the
:class:`~edgesdk.schemas.messages.EnrollRequest` and publishes it retained on
``devices/{id}/enroll``, so an operator who lists requests later still sees it. The daemon
calls :func:`announce_enrollment` once the link is started; the QoS 1 publish waits in the
MQTT session until the broker is reachable.
"""

from __future__ import annotations

import base64
import logging
import socket
from datetime import datetime, timezone
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk._version import __version__
from edgesdk.errors import LinkError
from edgesdk.keys import key_id
from edgesdk.schemas.messages import EnrollRequest

log = logging.getLogger("edgesdk.agent.enrollment")


def enrollment_request(device_id: str, device_key: X25519PrivateKey, *, profile: str | None = None) -> EnrollRequest:
    """The enroll request for this device: identity and public key, never the private key."""
    public = device_key.public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return EnrollRequest(
        device_id=device_id,
        ts=datetime.now(timezone.utc),
        public_key=base64.b64encode(raw).decode(),
        key_id=key_id(public),
        profile=profile,
        agent_version=__version__,
        hostname=socket.gethostname(),
    )


def announce_enrollment(agent: Any, link: Any) -> EnrollRequest | None:
    """Publish the agent's enroll request (retained, QoS 1) through its MQTT link."""
    from edgesdk.protocol import topics

    device_key = getattr(agent, "device_key", None)
    if device_key is None:
        log.warning("agent has no device key; not announcing enrollment")
        return None
    request = enrollment_request(agent.config.device_id, device_key, profile=agent.config.profile)
    topic = topics.device_topic(agent.config.mqtt.namespace, agent.config.device_id, topics.ENROLL)
    try:
        link.client.publish(topic, request.model_dump_json().encode(), qos=1, retain=True)
    except LinkError as exc:
        log.warning("could not publish enroll request: %s", exc)
        return None
    log.info("enroll request published: device %s, key id %s", request.device_id, request.key_id)
    return request
