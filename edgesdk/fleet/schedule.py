"""When a rollout may send: its scheduled start (``--start-at``) and its maintenance window
(``--window 02:00-04:00``), as a rollout's plan carries them.

The window is in the devices' local time. Devices do not report a timezone today, so that is
the zone named with the window (``--window-tz Europe/Berlin``), else the service's default
(``$EDGESDK_FLEET_TIMEZONE``, an IANA name), else UTC — read when the wave is due, by the process
that drives the rollout. A window whose end is before its start wraps midnight (22:00-04:00).
"""

from __future__ import annotations

import os
import re
from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from edgesdk.errors import UsageError

TIMEZONE_ENV = "EDGESDK_FLEET_TIMEZONE"
_WINDOW = re.compile(r"^\s*([01]\d|2[0-3]):([0-5]\d)\s*-\s*([01]\d|2[0-3]):([0-5]\d)\s*$")


def parse_start_at(text: str, *, option: str = "--start-at") -> float:
    """Unix seconds of an ISO 8601 time with its zone (``2026-12-06T02:00Z``, ``…+01:00``)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"bad {option} {text!r}: expected an ISO 8601 time with its zone, e.g. 2026-12-06T02:00Z"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"bad {option} {text!r}: say its zone (2026-12-06T02:00Z or …T02:00+01:00)")
    return moment.timestamp()


def parse_window(text: str, *, option: str = "--window") -> tuple[time, time]:
    """``HH:MM-HH:MM`` as (start, end); equal ends are refused (an empty or a full day?)."""
    match = _WINDOW.match(text)
    if match is None:
        raise UsageError(f"bad {option} {text!r}: expected HH:MM-HH:MM in 24 h, e.g. 02:00-04:00")
    start = time(int(match.group(1)), int(match.group(2)))
    end = time(int(match.group(3)), int(match.group(4)))
    if start == end:
        raise UsageError(f"bad {option} {text!r}: start and end are the same minute")
    return start, end


def zone(name: str | None, *, option: str = "--window-tz") -> ZoneInfo:
    """The named zone, else the service's default (``$EDGESDK_FLEET_TIMEZONE``), else UTC."""
    chosen = name or os.environ.get(TIMEZONE_ENV) or "UTC"
    try:
        return ZoneInfo(chosen)
    except (ZoneInfoNotFoundError, ValueError):
        source = option if name else f"${TIMEZONE_ENV}"
        raise UsageError(f"bad {source} {chosen!r}: expected an IANA zone name such as Europe/Berlin") from None


def in_window(now: float, window: str, tz: ZoneInfo) -> bool:
    start, end = parse_window(window)
    local = datetime.fromtimestamp(now, tz).time().replace(second=0, microsecond=0)
    if start < end:
        return start <= local < end
    return local >= start or local < end  # wraps midnight


def waiting_for(now: float, start_at: float | None, window: str | None, tz_name: str | None) -> str | None:
    """Why a rollout may not send now (one line for its status), or None when it may."""
    if start_at is not None and now < start_at:
        when = datetime.fromtimestamp(start_at, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
        return f"scheduled: waiting for its start at {when}"
    if window is not None:
        tz = zone(tz_name)
        if not in_window(now, window, tz):
            return f"waiting for its maintenance window {window.strip()} ({tz.key}, {next_opening(now, window, tz)})"
    return None


def next_opening(now: float, window: str, tz: ZoneInfo) -> str:
    """``opens in 3h 20m`` for the status line."""
    start, _ = parse_window(window)
    local = datetime.fromtimestamp(now, tz)
    opening = local.replace(hour=start.hour, minute=start.minute, second=0, microsecond=0)
    if opening <= local:
        opening += timedelta(days=1)
    minutes = int((opening - local).total_seconds() // 60)
    return f"opens in {minutes // 60}h {minutes % 60:02d}m"
