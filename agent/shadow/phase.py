"""The shadow phase before activation (issue 41): for ``HealthCriteria.shadow_s`` the staged model
runs on the sampled share of live requests the serving model answers, and answers nobody.

The serving model never stops: the staged one is verified and decrypted in memory into a second
ModelServer, only when its load size fits in the model memory budget left free (it counts
against the budget like any loaded model), and the same ShadowRunner as probation's runs it on
its one niced worker, judging it against the live answers. The outcome is ``refused`` (a reason
with the figure: the update stops before activation) or None (activation and probation go on).
Without ``min_agreement`` the phase only reports its figure; a phase that cannot run (no
memory, no tap) then says why and decides nothing, and with ``min_agreement`` it fails closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgesdk.agent.shadow.agreement import Agreement
from edgesdk.agent.shadow.check import DEFAULT_SHADOW_RATE, ShadowCheck
from edgesdk.agent.shadow.reference import ShadowDevice, VerifyAndLoad, from_bundle
from edgesdk.agent.shadow.runner import ShadowRunner

from edgesdk.errors import EdgeSDKError

log = logging.getLogger(__name__)

WINDOW = "the shadow phase"


@dataclass(frozen=True)
class PhaseOutcome:
    """What the shadow phase found: ``refused`` (why the update must stop) or None, and its line."""

    refused: str | None
    summary: str


def run_shadow_phase(
    health: Any,
    server: Any,
    manifest: Callable[[], Any],
    *,
    load_staged: VerifyAndLoad,
    device: ShadowDevice | None,
    cancelled: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    check_interval_s: float = 0.1,
) -> PhaseOutcome:
    """Shadow the staged bundle (``load_staged`` opens it) beside ``server`` for ``health.shadow_s``
    seconds; ``manifest()`` is the staged bundle's, once loaded. Returns early when ``cancelled()`` (the caller raises) or when the model is certainly wrong."""
    check = _start(health, server, manifest, load_staged, device)
    if check.runner is None:
        return _without(check)
    end = clock() + float(health.shadow_s)
    try:
        while clock() < end and not cancelled():
            breach = check.breach(final=False)
            if breach is not None:
                return PhaseOutcome(f"shadow phase: {breach}", check.summary())
            time.sleep(min(check_interval_s, max(0.0, end - clock())))
        breach = check.breach(final=True) if not cancelled() else None
        return PhaseOutcome(f"shadow phase: {breach}" if breach else None, f"shadow phase: {check.summary()}")
    finally:
        check.stop()  # tap off, worker joined: the staged model's server is then dropped


def _start(
    health: Any, server: Any, manifest: Callable[[], Any], load_staged: VerifyAndLoad, device: ShadowDevice | None
) -> ShadowCheck:
    minimum = health.min_agreement
    rate = DEFAULT_SHADOW_RATE if health.shadow_rate is None else health.shadow_rate
    taps = device.taps if device is not None and device.taps is not None else server.taps
    served = server.model
    if served is None:
        return ShadowCheck(minimum, absent="no model serves: nothing to shadow", window=WINDOW)
    if device is None:
        return ShadowCheck(minimum, absent="this updater knows no memory budget for the staged model", window=WINDOW)
    try:
        found = from_bundle(load_staged, server.profile, device.free_mb(), what="the staged release")
    except EdgeSDKError as exc:
        return ShadowCheck(minimum, absent=f"the staged release could not be loaded: {exc}", window=WINDOW)
    if isinstance(found, str):
        return ShadowCheck(minimum, absent=found, window=WINDOW)
    runner = ShadowRunner(
        served.name,
        found,
        Agreement(manifest()),
        rate=rate,
        pressure=device.pressure,
        minimum=minimum,
        runs_candidate=True,
    )
    runner.start()
    taps.append(runner.tap)
    log.info("shadow phase of %s: staged release beside release %d at rate %g", served.name, served.release, rate)
    check = ShadowCheck(minimum, runner, reference_release=served.release, window=WINDOW)
    check.detach = lambda: _remove(taps, runner.tap)
    return check


def _without(check: ShadowCheck) -> PhaseOutcome:
    """No shadow could run: fail closed only when the deployment asks a minimum."""
    breach = check.breach(final=True)
    return PhaseOutcome(f"shadow phase: {breach}" if breach else None, f"no shadow phase: {check.absent}")


def _remove(taps: list[Any], tap: Any) -> None:
    try:
        taps.remove(tap)
    except ValueError:
        pass
