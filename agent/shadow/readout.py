"""The running shadow's figures for telemetry (read only): each output's agreement so far, read
the way probation reads it, so the operator sees the figure the gate will judge.

A probation's runner sits on its server's taps (``start_shadow`` puts it there and takes it off
when probation ends), so the taps are where a running shadow is found: nothing in the request
path or the updater has to tell telemetry about it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any

from edgesdk.schemas.messages import ShadowAgreement


def live_agreement(taps: Iterable[Any], model_name: str) -> dict[str, ShadowAgreement] | None:
    """Per output, the agreement of ``model_name``'s running shadow among ``taps``; None when none runs."""
    runner_module = sys.modules.get("edgesdk.agent.shadow.runner")
    if runner_module is None:  # never imported: no probation has started a shadow in this process
        return None
    for tap in list(taps):
        runner = getattr(tap, "__self__", None)
        if isinstance(runner, runner_module.ShadowRunner) and runner.model_name == model_name:
            return _figures(runner)
    return None


def _figures(runner: Any) -> dict[str, ShadowAgreement]:
    minimum = runner.minimum
    found: dict[str, ShadowAgreement] = {}
    for reading in runner.agreement.readings(minimum):
        if math.isfinite(reading.value) and math.isfinite(reading.lower_bound):
            found[reading.name] = ShadowAgreement(
                kind=reading.kind,
                value=reading.value,
                lower_bound=reading.lower_bound,
                samples=reading.samples,
                minimum=minimum,
            )
    return found
