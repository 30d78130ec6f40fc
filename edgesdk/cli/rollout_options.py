"""The options of a staged rollout, shared by ``fleet push`` and ``fleet submit``.

``@rollout_options`` adds them to a command and hands it one :class:`RolloutArgs` (keyword
``rollout``) instead of a dozen loose values; it turns them into the plan, the health criteria
and the REST body, so both commands read and check them the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

import click

from edgesdk.errors import UsageError

EXPIRES_HELP = (
    "How long each command sent to devices stays valid; devices refuse it afterwards. Each wave gets a fresh one."
)


@dataclass(frozen=True)
class RolloutArgs:
    """What the operator asked for, as typed (parsed by the methods)."""

    group: str | None
    devices: str | None
    target_filter: str | None
    where: str | None
    canary: str
    waves: str
    max_failures: str
    probation: str
    p95_ms: float | None
    max_error_rate: str
    min_agreement: str | None
    shadow_rate: str | None
    shadow_for: str | None
    wave_timeout: str | None
    artifact_urls: tuple[str, ...]
    mqtt_fallback: bool
    chunk_size: int | None
    deployment_id: str | None
    expires: str
    start_at: str | None
    window: str | None
    window_tz: str | None

    def __post_init__(self) -> None:
        from edgesdk.schemas.messages import MAX_CHUNK_SIZE, MAX_P95_LATENCY_MS

        # click reads "inf" and "nan" as floats: "not 0 < x <= max" refuses both.
        if self.p95_ms is not None and not 0 < self.p95_ms <= MAX_P95_LATENCY_MS:
            raise UsageError(f"bad --p95-ms {self.p95_ms:g}: expected above 0 and at most {MAX_P95_LATENCY_MS:g} ms")
        if self.chunk_size is not None and not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise UsageError(f"bad --chunk-size {self.chunk_size}: expected 1 to {MAX_CHUNK_SIZE} bytes")

    def device_list(self) -> list[str] | None:
        return [d.strip() for d in self.devices.split(",") if d.strip()] if self.devices is not None else None

    def check_targets(self) -> None:
        if [self.group, self.devices, self.target_filter, self.where].count(None) != 3:
            raise UsageError("give exactly one of --group G, --devices A,B, --target-filter NAME or --where EXPR")

    @property
    def dynamic(self) -> bool:
        """Whether the targets are a dynamic group (resolved by the fleet service, from its tags)."""
        return self.target_filter is not None or self.where is not None

    def resolved_devices(self, engine: Any) -> list[str] | None:
        """The device ids: ``--devices``, or what ``--target-filter``/``--where`` select now in the
        fleet service's database ``engine``; None for ``--group``."""
        self.check_targets()
        if not self.dynamic:
            return self.device_list()
        from edgesdk.fleet.service import targeting

        where = self.where if self.where is not None else targeting.saved_filter(engine, self.target_filter or "")
        found = targeting.select_devices(engine, where)
        if not found:
            raise UsageError(f"no known device matches {where!r} (edgesdk fleet filter list --server …)")
        return found

    def urls(self) -> list[str]:
        """``--artifact-url`` values, each checked to be http(s)://HOST/..."""
        for url in self.artifact_urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UsageError(f"bad --artifact-url {url!r}: expected http(s)://HOST/PATH")
        if len(self.artifact_urls) > 8:
            raise UsageError(f"{len(self.artifact_urls)} --artifact-url given; at most 8")
        return list(self.artifact_urls)

    def plan(self) -> Any:
        from edgesdk.fleet.rollout import RolloutPlan, parse_percent, parse_waves

        return RolloutPlan(
            canary=parse_percent(self.canary, option="--canary"),
            waves=parse_waves(self.waves),
            max_failures=parse_percent(self.max_failures, option="--max-failures"),
            probation_s=bounded_duration(self.probation, option="--probation"),
            wave_timeout_s=self.wave_timeout_s(),
            command_ttl_s=positive_duration(self.expires),
            **self.schedule(),
        )

    def shadow_s(self) -> float | None:
        """--shadow-for in seconds; 0 is no phase, left off the wire like no option (older agents)."""
        return (bounded_duration(self.shadow_for, option="--shadow-for") or None) if self.shadow_for else None

    def wave_timeout_s(self) -> float | None:
        """--wave-timeout; with --shadow-for and none given, the default (probation + 10m) plus the shadow phase."""
        if self.wave_timeout:
            return bounded_duration(self.wave_timeout, option="--wave-timeout")
        from edgesdk.schemas.messages import MAX_PROBATION_S

        shadow_s = self.shadow_s()
        if not shadow_s:
            return None
        return min(bounded_duration(self.probation, option="--probation") + shadow_s + 600.0, MAX_PROBATION_S)

    def schedule(self) -> dict[str, Any]:
        """``start_at``, ``window`` and ``window_tz`` of the plan, each checked."""
        from edgesdk.fleet import schedule

        if self.window is not None:
            schedule.parse_window(self.window)
        if self.window_tz is not None:
            if self.window is None:
                raise UsageError("--window-tz names the zone of --window; give --window HH:MM-HH:MM too")
            schedule.zone(self.window_tz)
        return {
            "start_at": schedule.parse_start_at(self.start_at) if self.start_at is not None else None,
            "window": self.window,
            "window_tz": self.window_tz,
        }

    def health(self, plan: Any) -> Any:
        from edgesdk.fleet.rollout import parse_percent
        from edgesdk.schemas.messages import HealthCriteria

        shadow_rate = parse_percent(self.shadow_rate, option="--shadow-rate") if self.shadow_rate else None
        minimum = parse_fraction(self.min_agreement, option="--min-agreement") if self.min_agreement else None
        if minimum is not None and shadow_rate == 0:
            raise UsageError("--min-agreement needs a --shadow-rate above 0% (no request would be compared)")
        shadow_s = self.shadow_s()
        if shadow_s and shadow_rate == 0:
            raise UsageError("--shadow-for needs a --shadow-rate above 0% (no request would be compared)")
        return HealthCriteria(
            probation_s=plan.probation_s,
            p95_latency_ms=self.p95_ms,
            max_error_rate=parse_percent(self.max_error_rate, option="--max-error-rate"),
            min_agreement=minimum,
            shadow_rate=shadow_rate,
            shadow_s=shadow_s,
        )

    def api_body(self) -> dict[str, Any]:
        """The ``POST /api/v1/deployments`` body (without ``bundle_id``)."""
        self.check_targets()
        plan = self.plan()
        health = self.health(plan)
        body = {
            "group": self.group,
            "devices": self.device_list(),
            "target_filter": self.target_filter,
            "where": self.where,
            "deployment_id": self.deployment_id,
            "canary": plan.canary,
            "waves": list(plan.waves),
            "max_failures": plan.max_failures,
            "probation_s": plan.probation_s,
            "p95_ms": health.p95_latency_ms,
            "max_error_rate": health.max_error_rate,
            "min_agreement": health.min_agreement,
            "shadow_rate": health.shadow_rate,
            "shadow_s": health.shadow_s,
            "wave_timeout_s": plan.wave_timeout_s,
            "expires_s": plan.command_ttl_s,
            "chunk_size": self.chunk_size,
            "artifact_urls": self.urls() or None,
            "mqtt_fallback": self.mqtt_fallback,
            "start_at": self.start_at,
            "window": self.window,
            "window_tz": self.window_tz,
        }
        return {k: v for k, v in body.items() if v is not None}


def parse_fraction(text: str, *, option: str) -> float:
    """``"0.95"`` or ``"95%"`` → 0.95; UsageError naming the option and value otherwise."""
    from edgesdk.fleet.rollout import parse_percent

    if text.strip().endswith("%"):
        return parse_percent(text, option=option)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise UsageError(f"bad {option} {text!r}: expected a fraction between 0 and 1 or a percentage, e.g. 0.95")
    return value


def bounded_duration(text: str, *, option: str) -> float:
    """``--probation``, ``--wave-timeout``: a duration of at most 30 days (``MAX_PROBATION_S``)."""
    from edgesdk.fleet.rollout import parse_duration
    from edgesdk.schemas.messages import MAX_PROBATION_S

    seconds = parse_duration(text, option=option)
    if seconds > MAX_PROBATION_S:
        raise UsageError(f"bad {option} {text!r}: at most {MAX_PROBATION_S / 86400:g} days")
    return seconds


def positive_duration(text: str) -> float:
    """``--expires``: a command lifetime from 1 s to a week (``MAX_COMMAND_VALIDITY_S``, what
    devices accept by default and the fleet service allows)."""
    from edgesdk.fleet.rollout import parse_duration
    from edgesdk.schemas.messages import MAX_COMMAND_VALIDITY_S

    seconds = parse_duration(text, option="--expires")
    if seconds < 1:
        raise UsageError(f"bad --expires {text!r}: a command must stay valid for at least 1 s, e.g. 30m or 6h")
    if seconds > MAX_COMMAND_VALIDITY_S:
        raise UsageError(
            f"bad --expires {text!r}: at most {MAX_COMMAND_VALIDITY_S / 86400:g} days "
            f"({MAX_COMMAND_VALIDITY_S:g} s); devices refuse a command valid for longer, e.g. 6h or 2d"
        )
    return seconds


_OPTIONS = [
    click.option("--group", default=None, help="Deploy to every device of this group."),
    click.option("--devices", default=None, help="Comma-separated device ids."),
    click.option(
        "--target-filter",
        default=None,
        help="Deploy to the devices a saved dynamic group selects when the rollout is created (fleet filter save).",
    ),
    click.option(
        "--where",
        default=None,
        help="Deploy to the devices this filter selects when the rollout is created, e.g. "
        "'tag.site=berlin and profile=pi5' (fields tag.KEY, profile, model, version, group; = or !=; and).",
    ),
    click.option("--canary", default="10%", show_default=True, help="Share of devices in the first wave."),
    click.option("--waves", default="10%,50%,100%", show_default=True, help="Cumulative shares per wave."),
    click.option(
        "--max-failures", default="5%", show_default=True, help="Abort when more of the reached devices fail."
    ),
    click.option("--probation", default="10m", show_default=True, help="How long a device watches the new model."),
    click.option("--p95-ms", type=float, default=None, help="p95 latency SLO during probation (ms)."),
    click.option("--max-error-rate", default="1%", show_default=True, help="Error rate allowed during probation."),
    click.option(
        "--min-agreement",
        default=None,
        help="Roll a device back when, in probation, the lower 95 % bound of its new model's agreement with the "
        "previous release on sampled live requests is below this (0..1 or a percentage, e.g. 0.95).",
    ),
    click.option(
        "--shadow-rate",
        default=None,
        help="Share of live requests also run on the previous release during probation (default 10 percent; 0 = off).",
    ),
    click.option(
        "--shadow-for",
        default=None,
        help="Before activation, run the new model for this long (e.g. 10m) on the --shadow-rate share of the live "
        "requests the current model answers; it answers nobody. Below --min-agreement the update is refused.",
    ),
    click.option(
        "--wave-timeout",
        default=None,
        help="Each wave's deadline: a device without a final word by then counts as failed "
        "('no answer within …'). Default: probation + 10m (20m with the default --probation).",
    ),
    click.option(
        "--artifact-url",
        "--url",
        "artifact_urls",
        multiple=True,
        help="HTTP(S) URL devices download the bundle from, with Range and resume (repeatable: tried in order; "
        "then MQTT chunks). Signed with the deployment; devices check the bytes against its hashes.",
    ),
    click.option(
        "--mqtt-fallback/--no-mqtt-fallback",
        default=True,
        show_default=True,
        help="Let devices fetch MQTT chunks when every --artifact-url fails.",
    ),
    click.option("--chunk-size", type=int, default=None, help="Bytes per chunk (default 262144)."),
    click.option(
        "--deployment-id", default=None, help="Id for the deployment; an unfinished one with this id resumes."
    ),
    click.option("--expires", default="6h", show_default=True, help=EXPIRES_HELP),
    click.option(
        "--start-at",
        default=None,
        help="Send nothing before this time (ISO 8601 with its zone, e.g. 2026-12-06T02:00Z); PENDING until then.",
    ),
    click.option(
        "--window",
        default=None,
        help="Maintenance window HH:MM-HH:MM in the devices' local time (22:00-04:00 wraps midnight): "
        "each wave starts, and commands are sent, only inside it.",
    ),
    click.option(
        "--window-tz",
        default=None,
        help="The devices' zone for --window (IANA, e.g. Europe/Berlin); default: the fleet service's "
        "$EDGESDK_FLEET_TIMEZONE, else UTC (devices do not report one).",
    ),
]
_FIELDS = tuple(f.name for f in fields(RolloutArgs))


def rollout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the rollout options to a click command; it receives them as ``rollout=RolloutArgs``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _FIELDS}
        return command(*args, rollout=RolloutArgs(**values), **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
