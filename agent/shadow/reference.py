"""The previous release as a second ModelServer, for the shadow worker to run.

During probation the updater keeps the previous release loaded (``AgentUpdateTarget``'s
``_previous_model``) so a rollback is a reference switch: the shadow server serves those same
loaded variants and costs no memory beyond what the rollback already holds. After an agent
restart in probation nothing of it is loaded: the previous slot's bundle is then verified again,
decrypted in memory and loaded with :meth:`ModelServer.swap`, only when its load size fits in
what the device's model memory budget has free; otherwise there is no shadow, and the reason
says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgesdk.agent.memory_budget import bundle_load_mb
from edgesdk.agent.serving import ModelServer


@dataclass(frozen=True)
class ShadowDevice:
    """What the agent tells a model's updater about the device (agent/shadow/wiring.py)."""

    #: MB of the model memory budget not held by any serving model.
    free_mb: Callable[[], float]
    #: Why the device is under thermal or power pressure now, or None.
    pressure: Callable[[], str | None]
    #: The taps the API calls for every model's answers: the default model's server's
    #: (``ModelServer.taps``); each tap filters on the model name.
    taps: list[Any] | None = None


def from_memory(previous: Any, profile: Any) -> ModelServer:
    """A server of the already-loaded previous model (its active variant first)."""
    server = ModelServer(profile=profile, allow_nonfinite=True)
    server.serve(
        name=previous.name,
        version=previous.version,
        release=previous.release,
        bundle_sha256=previous.bundle_sha256,
        variants=[(v.meta, v.loaded) for v in previous.ladder],
        start_variant=previous.active.id,
        choices=previous.choices,
        pipeline=previous.pipeline,  # /predict's steps come back with the model
    )
    return server


#: ``verify_and_load(fits, server)``: verify the previous slot's bundle, ask ``fits(manifest)``
#: (None: it fits, else why not, returned as is) and only then load it into ``server``.
VerifyAndLoad = Callable[[Callable[[Any], "str | None"], ModelServer], "str | None"]


def from_slot(slots: Any, verify_and_load: VerifyAndLoad, profile: Any, free_mb: float | None) -> ModelServer | str:
    """A server of the previous slot's bundle, decrypted in memory; or why there is none: the slot
    is gone, or its bundle does not fit in ``free_mb`` (None: no budget known, nothing is loaded)."""
    slot = slots.previous_slot
    if slot is None or not slots.bundle_path(slot).is_file():
        return "the previous release's slot is gone"
    if free_mb is None:
        return "the previous release is not loaded and this updater knows no memory budget"
    return from_bundle(verify_and_load, profile, free_mb, what="the previous release")


def from_bundle(verify_and_load: VerifyAndLoad, profile: Any, free_mb: float, *, what: str) -> ModelServer | str:
    """A server of the bundle ``verify_and_load`` opens, loaded only when it fits in ``free_mb``
    (the model memory budget not held by a serving model); else why not, naming ``what`` and the figures."""
    server = ModelServer(profile=profile, allow_nonfinite=True)

    def fits(manifest: Any) -> str | None:
        need = bundle_load_mb(manifest)
        if need <= free_mb:
            return None
        return f"{what} needs {need:.1f} MB to load and the model memory budget has {free_mb:.1f} MB free"

    why_not = verify_and_load(fits, server)
    return server if why_not is None else why_not
