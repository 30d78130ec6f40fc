"""Starting a probation's shadow: find the reference, start the worker, install the tap."""

from __future__ import annotations

import logging
from typing import Any

from edgesdk.agent.shadow.agreement import Agreement
from edgesdk.agent.shadow.check import DEFAULT_SHADOW_RATE, ShadowCheck
from edgesdk.agent.shadow.reference import ShadowDevice, VerifyAndLoad, from_memory, from_slot
from edgesdk.agent.shadow.runner import ShadowRunner

from edgesdk.errors import EdgeSDKError

log = logging.getLogger(__name__)


def start_shadow(
    health: Any,
    server: Any,
    manifest: Any,
    *,
    previous: Any,
    slots: Any,
    verify_and_load: VerifyAndLoad,
    device: ShadowDevice | None,
) -> ShadowCheck:
    """The shadow of the model ``server`` serves, against the previous release: loaded ``previous``
    when there is one, else the previous slot's bundle (within the memory budget). Never raises:
    without a reference the check says why (and fails probation only when min_agreement is asked)."""
    minimum = health.min_agreement
    rate = DEFAULT_SHADOW_RATE if health.shadow_rate is None else health.shadow_rate
    if rate <= 0:
        return ShadowCheck(minimum, absent="the deployment set shadow_rate 0")
    taps = device.taps if device is not None and device.taps is not None else server.taps
    model = server.model
    if model is None or manifest is None:
        return ShadowCheck(minimum, absent="no model serves (or its manifest is gone): nothing to shadow")
    try:
        if previous is not None:
            reference = from_memory(previous, server.profile)
        else:
            free = device.free_mb() if device is not None else None
            found = from_slot(slots, verify_and_load, server.profile, free)
            if isinstance(found, str):
                return ShadowCheck(minimum, absent=found)
            reference = found
    except EdgeSDKError as exc:
        return ShadowCheck(minimum, absent=f"the previous release could not be loaded: {exc}")
    old = reference.model
    if old is None or old.bundle_sha256 == model.bundle_sha256:
        return ShadowCheck(minimum, absent="no previous release differs from the one serving")
    pressure = device.pressure if device is not None else (lambda: None)
    runner = ShadowRunner(model.name, reference, Agreement(manifest), rate=rate, pressure=pressure, minimum=minimum)
    runner.start()
    taps.append(runner.tap)
    log.info("shadow of %s on release %d at rate %g", model.name, old.release, rate)
    check = ShadowCheck(minimum, runner, reference_release=old.release)
    check.detach = lambda: _remove(taps, runner.tap)
    return check


def _remove(taps: list[Any], tap: Any) -> None:
    try:
        taps.remove(tap)
    except ValueError:
        pass
