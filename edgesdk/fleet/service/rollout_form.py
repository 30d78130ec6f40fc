"""The dashboard's *Start a rollout* form: its HTML, and its fields read as a plan.

A bad value is a :class:`FieldError` naming the field; the dashboard then answers 422 with the
form again, every value the operator typed kept and the message beside the field it is about
(issue 40: a bare "could not convert string to float: 'abc'" page, HTTP 200, the form lost).
"""

from __future__ import annotations

import html
import math
from typing import Any

from edgesdk.errors import UsageError
from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.schemas.messages import MAX_PROBATION_S, HealthCriteria

#: The form's fields and what they hold when the page first shows it.
DEFAULTS = {
    "bundle_id": "",
    "target_kind": "group",
    "target": "",
    "canary": "10%",
    "waves": "10%,50%,100%",
    "max_failures": "0%",
    "probation_s": "600",
    "p95_ms": "",
    "min_agreement": "",
    "shadow_rate": "",
    "shadow_s": "",
}


class FieldError(UsageError):
    """A bad value of one form field (``field``), with what to type instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _percent(fields: dict[str, str], name: str, label: str, text: str | None = None) -> float:
    raw = text if text is not None else (fields.get(name, "").strip() or DEFAULTS[name])
    try:
        value = float(raw.strip().rstrip("%")) / 100.0
    except ValueError:
        raise FieldError(name, f"{label} {raw!r} is not a percentage, e.g. 10%") from None
    if not 0.0 <= value <= 1.0:
        raise FieldError(name, f"{label} {raw!r} must be between 0% and 100%")
    return value


def _seconds_or_ms(fields: dict[str, str], name: str, label: str) -> float | None:
    raw = fields.get(name, "").strip() or DEFAULTS[name]
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise FieldError(name, f"{label} {raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise FieldError(name, f"{label} {raw!r} must be a number of 0 or more")
    return value


def _bounded_seconds(fields: dict[str, str], name: str, label: str) -> float | None:
    """Seconds of a phase, at most 30 days as REST bounds them (agents refuse a longer one)."""
    value = _seconds_or_ms(fields, name, label)
    if value is not None and value > MAX_PROBATION_S:
        raise FieldError(
            name, f"{label} {fields.get(name, '').strip()!r} must be at most {MAX_PROBATION_S:.0f} s (30 days)"
        )
    return value


def _shadowing(fields: dict[str, str]) -> dict[str, float | None]:
    """min_agreement, shadow_rate and shadow_s of the health criteria; blank (and a 0 s phase) is
    left off the wire, as ``fleet push`` leaves them, since older agents refuse the fields."""
    agreement = fields.get("min_agreement", "").strip()  # shadow agreement with the previous release (docs/ota.md)
    minimum = _percent(fields, "min_agreement", "min agreement", agreement) if agreement else None
    rate_text = fields.get("shadow_rate", "").strip()
    rate = _percent(fields, "shadow_rate", "shadow rate", rate_text) if rate_text else None
    phase = _bounded_seconds(fields, "shadow_s", "shadow phase") or None
    for asked, label in ((minimum is not None, "min agreement"), (phase is not None, "a shadow phase")):
        if asked and rate == 0:
            raise FieldError("shadow_rate", f"{label} needs a shadow rate above 0% (no request would be compared)")
    return {"min_agreement": minimum, "shadow_rate": rate, "shadow_s": phase}


def plan_from(fields: dict[str, str]) -> tuple[RolloutPlan, HealthCriteria, list[str] | None, str | None]:
    """The form's fields as (plan, health, devices, group); FieldError naming the bad field."""
    waves_text = fields.get("waves", "").strip() or DEFAULTS["waves"]
    waves = tuple(_percent(fields, "waves", "waves", w) for w in waves_text.split(",") if w.strip())
    if not waves or list(waves) != sorted(waves) or waves[-1] != 1.0:
        raise FieldError("waves", f"waves {waves_text!r} must rise and end at 100%")
    probation = _bounded_seconds(fields, "probation_s", "probation") or 0.0
    p95 = _seconds_or_ms(fields, "p95_ms", "p95 SLO")
    shadowing = _shadowing(fields)
    phase = shadowing["shadow_s"]
    # As REST: a shadow phase lengthens each wave's default deadline (probation + 10 min) by itself.
    wave_timeout = min(probation + phase + 600.0, MAX_PROBATION_S) if phase else None
    try:
        plan = RolloutPlan(
            canary=_percent(fields, "canary", "canary"),
            waves=waves,
            max_failures=_percent(fields, "max_failures", "max failures"),
            probation_s=probation,
            wave_timeout_s=wave_timeout,
        )
        health = HealthCriteria(probation_s=probation, p95_latency_ms=p95, **shadowing)
    except FieldError:
        raise
    except ValueError as exc:  # the models' own bounds (pydantic's ValidationError is one)
        raise FieldError("", f"the plan is refused: {exc}") from None
    target = fields.get("target", "").strip()
    if not target:
        raise FieldError("target", "give a group or a comma-separated list of devices")
    if fields.get("target_kind") == "devices":
        return plan, health, [d.strip() for d in target.split(",") if d.strip()], None
    return plan, health, None, target


def rollout_form(
    uploaded: list[dict[str, Any]],
    csrf: str,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
) -> str:
    """The upload and new-rollout sections; ``values`` refill the fields, ``errors`` sit beside them."""
    values = {**DEFAULTS, **(values or {})}
    errors = errors or {}

    def error(name: str) -> str:
        return f' <span class="bad field-error" id="error-{name}">{_e(errors[name])}</span>' if name in errors else ""

    def text(name: str, label: str, kind: str = "text", extra: str = "") -> str:
        return f'<label>{label} <input type={kind} name={name} value="{_e(values[name])}"{extra}>{error(name)}</label>'

    options = "".join(
        f'<option value="{_e(b["id"])}"{" selected" if b["id"] == values["bundle_id"] else ""}>'
        f"{_e(b['model_name'])} {_e(b['model_version'])} (release {b['model_release']}, {_e(b['filename'])})</option>"
        for b in uploaded
    )
    kinds = "".join(
        f"<option value={k}{' selected' if values['target_kind'] == k else ''}>{k}</option>"
        for k in ("group", "devices")
    )
    general = f'<p class="bad field-error" id="error-form">{_e(errors[""])}</p>' if "" in errors else ""
    return (
        "<section><h2>Upload a bundle</h2>"
        f'<form id=upload-form data-csrf="{csrf}"><input type=file id=bundle-file accept=".edgepkg">'
        "<button type=submit id=upload>Upload</button> <span id=upload-status></span></form></section>"
        f"<section><h2>Start a rollout</h2>{general}<form method=post action=/ui/deployments id=new-rollout>"
        f'<input type=hidden name=csrf value="{csrf}">'
        f"<label>bundle <select name=bundle_id id=bundle>{options}</select>{error('bundle_id')}</label>"
        f"<label><select name=target_kind>{kinds}</select>"
        f' <input type=text name=target id=target placeholder="line-1" value="{_e(values["target"])}">'
        f"{error('target')}</label>"
        + text("canary", "canary")
        + text("waves", "waves")
        + text("max_failures", "max failures")
        + text("probation_s", "probation s", "number", " min=0")
        + text("p95_ms", "p95 SLO ms")
        + text("min_agreement", "min agreement %")
        + text("shadow_rate", "shadow rate %", extra=' placeholder="10%"')
        + text("shadow_s", "shadow phase s", "number", " min=0")
        + "<button type=submit id=start-rollout>Start</button></form></section>"
    )
