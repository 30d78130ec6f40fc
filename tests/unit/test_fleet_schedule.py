"""A rollout's schedule (``edgesdk.fleet.schedule``): windows in a zone, wrapping midnight, the
start time, and one-line errors naming the bad value."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from edgesdk.errors import UsageError
from edgesdk.fleet import schedule


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_window_is_read_in_the_devices_zone_and_may_wrap_midnight() -> None:
    berlin = schedule.zone("Europe/Berlin")
    assert schedule.in_window(_at("2026-12-06T01:30Z"), "02:00-04:00", berlin)  # 02:30 in Berlin
    assert not schedule.in_window(_at("2026-12-06T03:30Z"), "02:00-04:00", berlin)  # 04:30 in Berlin
    utc = schedule.zone("UTC")
    assert schedule.in_window(_at("2026-12-06T23:10Z"), "22:00-04:00", utc)
    assert schedule.in_window(_at("2026-12-07T03:59Z"), "22:00-04:00", utc)
    assert not schedule.in_window(_at("2026-12-07T04:00Z"), "22:00-04:00", utc)


def test_waiting_for_names_the_start_or_the_window_and_when_it_opens(monkeypatch) -> None:
    monkeypatch.setenv(schedule.TIMEZONE_ENV, "Asia/Tokyo")
    now = _at("2026-12-06T00:00Z")  # 09:00 in Tokyo
    assert schedule.waiting_for(now, _at("2026-12-06T02:00Z"), None, None) == (
        "scheduled: waiting for its start at 2026-12-06T02:00Z"
    )
    assert schedule.waiting_for(now, None, "02:00-04:00", None) == (
        "waiting for its maintenance window 02:00-04:00 (Asia/Tokyo, opens in 17h 00m)"
    )
    assert schedule.waiting_for(now, now - 1, "08:00-10:00", None) is None


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: schedule.parse_window("2-4"), "'2-4'"),
        (lambda: schedule.parse_window("24:00-02:00"), "'24:00-02:00'"),
        (lambda: schedule.parse_window("02:00-02:00"), "same minute"),
        (lambda: schedule.parse_start_at("tomorrow"), "'tomorrow'"),
        (lambda: schedule.parse_start_at("2026-12-06T02:00"), "zone"),
        (lambda: schedule.zone("Mars/Olympus"), "'Mars/Olympus'"),
    ],
)
def test_bad_schedule_values_are_one_line_errors_naming_them(call, named: str) -> None:
    with pytest.raises(UsageError) as error:
        call()
    assert named in str(error.value) and "\n" not in str(error.value)


def test_start_at_reads_a_zone_offset() -> None:
    assert (
        schedule.parse_start_at("2026-12-06T03:00+01:00") == datetime(2026, 12, 6, 2, tzinfo=timezone.utc).timestamp()
    )
