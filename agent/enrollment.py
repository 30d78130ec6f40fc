"""Enrollment on the device: announce the device's own public key so the operator can approve it.

The key pair itself is made by the agent on first start (``device.key`` 0600 and ``device.pub``
in the state directory; the private key never leaves the device). The request is built from the
public key alone (``Agent.device_public_key``: read from ``device.pub``), so announcing never
loads the private key or the crypto library into the daemon. This module only builds the
:class:`~edgesdk.schemas.messages.EnrollRequest` and publishes it retained on
``devices/{id}/enroll``, so an operator who lists requests later still sees it. The daemon
calls :func:`announce_enrollment` once the link is started; the QoS 1 publish waits in the
MQTT session until the broker is reachable.
"""

from __future__ import annotations

import logging
import socket
from datetime import datetime, timezone
from typing import Any

from edgesdk.agent.keyring import public_key_text, raw_key_id

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError, LinkError
from edgesdk.schemas.messages import EnrollRequest

log = logging.getLogger("edgesdk.agent.enrollment")


def enrollment_request(device_id: str, public_key: bytes, *, profile: str | None = None) -> EnrollRequest:
    """The enroll request for this device: identity and its raw 32-byte public key."""
    return EnrollRequest(
        device_id=device_id,
        ts=datetime.now(timezone.utc),
        public_key=public_key_text(public_key),
        key_id=raw_key_id(public_key),
        profile=profile,
        agent_version=__version__,
        hostname=socket.gethostname(),
    )


def announce_enrollment(agent: Any, link: Any) -> EnrollRequest | None:
    """Publish the agent's enroll request (retained, QoS 1) through its MQTT link."""
    from edgesdk.protocol import topics

    try:
        public_key = agent.device_public_key()
    except EdgeSDKError as exc:
        log.warning("cannot read the device public key; not announcing enrollment: %s", exc)
        return None
    if public_key is None:
        log.warning("agent has no device key; not announcing enrollment")
        return None
    request = enrollment_request(agent.config.device_id, public_key, profile=agent.config.profile)
    topic = topics.device_topic(agent.config.mqtt.namespace, agent.config.device_id, topics.ENROLL)
    try:
        link.client.publish(topic, request.model_dump_json().encode(), qos=1, retain=True)
    except LinkError as exc:
        log.warning("could not publish enroll request: %s", exc)
        return None
    log.info("enroll request published: device %s, key id %s", request.device_id, request.key_id)
    return request
