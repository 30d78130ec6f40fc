"""The topic scheme: one layout for device, fleet tools and ACL."""

from __future__ import annotations

import pytest

from edgesdk.errors import UsageError
from edgesdk.protocol import topics


def test_device_and_group_topics_follow_the_documented_layout() -> None:
    assert topics.device_topic("edgesdk", "rpi-001", topics.TELEMETRY) == "edgesdk/devices/rpi-001/telemetry"
    assert topics.group_topic("acme/prod", "line-1", topics.OTA_DEPLOYMENT) == "acme/prod/groups/line-1/ota/deployment"
    assert topics.all_devices_filter("edgesdk", "presence") == "edgesdk/devices/+/presence"


@pytest.mark.parametrize("bad_id", ["", "a/b", "dev+", "dev#", "../x", "-lead", "x" * 65])
def test_ids_that_could_escape_their_subtree_are_refused(bad_id: str) -> None:
    with pytest.raises(UsageError, match="invalid MQTT device id"):
        topics.device_topic("edgesdk", bad_id, "telemetry")


@pytest.mark.parametrize("bad_suffix", ["", "/x", "a//b", "#", "a/+"])
def test_bad_suffixes_are_refused(bad_suffix: str) -> None:
    with pytest.raises(UsageError, match="suffix"):
        topics.device_topic("edgesdk", "dev", bad_suffix)


def test_parse_topic_round_trips_and_rejects_foreign_topics() -> None:
    parsed = topics.parse_topic("edgesdk", topics.device_topic("edgesdk", "dev-1", "ota/status"))
    assert parsed == topics.ParsedTopic(scope="devices", name="dev-1", suffix="ota/status")
    assert topics.parse_topic("edgesdk", "other/devices/dev-1/telemetry") is None
    assert topics.parse_topic("edgesdk", "edgesdk/things/dev-1/telemetry") is None
    assert topics.parse_topic("edgesdk", "edgesdk/devices/dev-1") is None


def test_the_broker_acl_lets_a_device_write_exactly_the_suffixes_it_publishes() -> None:
    # The shipped mosquitto ACL and DEVICE_PUBLISHED must name the same suffixes: a suffix the
    # device publishes but the ACL forgets is dropped silently by the broker.
    from pathlib import Path

    acl = Path(__file__).parents[2] / "firmware_images" / "mosquitto" / "edgesdk.acl"
    prefix = "pattern write edgesdk/devices/%u/"
    granted = {line[len(prefix) :].strip() for line in acl.read_text().splitlines() if line.startswith(prefix)}
    assert granted == set(topics.DEVICE_PUBLISHED)
