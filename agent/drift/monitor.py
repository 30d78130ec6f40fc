"""The drift tap: every answered request of every model is counted into that model's window
(:mod:`edgesdk.agent.drift.window`), and each telemetry report takes the windows' figures.

``/metrics`` reads the same windows without taking them (:meth:`DriftMonitor.readouts`): the
scores of the window under way once it can be scored, else those of the last one reported, and
the counts since the agent started. An agent with no fleet never reports: there the monitor
closes a window itself at a scrape once it is :data:`ROLL_S` old, so its scores follow the
traffic of the last minute or two rather than of every request since start.

The reference profile is the one signed into the manifest of the bundle a model is serving
from: read from the installed slot's bundle file (the manifest is not encrypted, and the file's
front is the one verified when the slot was staged: its hash is checked again here). A model
whose bundle has no profile still reports its counts, with ``reference=False``.

Cost: the tap runs on the thread that answered, after the answer (ModelServer.taps). When a
model answers more than :data:`MAX_SAMPLED_RPS` requests a second, 1 in N is counted; the tap
measures that rate itself every :data:`RETUNE_EVERY` answers, so an agent with no fleet (no
telemetry report ever) samples as well as one that reports.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgesdk.agent.drift.window import ModelWindow
from edgesdk.agent.nonfinite import REFUSED
from edgesdk.agent.ports import AnswerTaps
from edgesdk.agent.shadow.readout import live_agreement

from edgesdk.drift.schema import ReferenceProfile
from edgesdk.errors import EdgeSDKError
from edgesdk.schemas.messages import ModelQuality

log = logging.getLogger("edgesdk.agent.drift")

#: Requests counted per second and model before the tap samples 1 in N (~0.1 ms each for a
#: 224x224x3 image: at most ~1 % of one core).
MAX_SAMPLED_RPS = 100.0
#: Answers between two measurements of a model's request rate (one clock read each).
RETUNE_EVERY = 256
#: Seconds a window runs in an agent with no telemetry before a ``/metrics`` read closes it.
ROLL_S = 60.0
#: The kinds of request ``/metrics`` counts per model (the fleet's ``edgesdk_fleet_model_requests_total``).
REQUEST_KINDS = ("sampled", "nonfinite", "out_of_range", "constant")


@dataclass(frozen=True)
class DriftReadout:
    """One model's drift on ``/metrics``: ``scores`` is the window whose ``inputs`` and
    ``outputs`` the gauges show; ``requests`` counts each of :data:`REQUEST_KINDS` since start."""

    scores: ModelQuality
    requests: dict[str, int]


def _counts(quality: ModelQuality) -> Counter[str]:
    return Counter(
        sampled=quality.samples,
        nonfinite=quality.nonfinite,
        out_of_range=quality.out_of_range,
        constant=quality.constant,
    )


def installed_reference(store: Any, bundle_sha256: str | None) -> ReferenceProfile | None:
    """The reference profile in the manifest of the store's slot holding bundle ``bundle_sha256``."""
    from edgesdk.bundle.reader import open_bundle_file, read_front
    from edgesdk.schemas.manifest import BundleManifest

    for slot in ("a", "b"):
        info = store.slot_info(slot)
        if bundle_sha256 and info and info.get("sha256") == bundle_sha256:
            path = store.bundle_path(slot)
            with open_bundle_file(path) as handle:
                front = read_front(handle, source=str(path))
            digest = hashlib.sha256(front.header.raw + front.manifest_bytes + front.signature).hexdigest()
            if info.get("front_sha256") not in (None, digest):
                raise EdgeSDKError(f"{path}: header and manifest changed since the slot was staged")
            return BundleManifest.parse_json_clear(front.manifest_bytes, source=str(path)).reference
    return None


class _Sampled:
    """A model's window with its 1-in-N sampling."""

    def __init__(self, window: ModelWindow, inputs: list[str]) -> None:
        self.window = window
        self.inputs = inputs  # its input names, to read the NaN/Inf refusals by
        self.refused = sum(REFUSED[name] for name in inputs)
        self.every = 1
        self.seen = itertools.count()
        self._since = time.monotonic()

    def due(self) -> bool:
        """Whether this answer is one of the 1 in N counted; every RETUNE_EVERY answers N follows
        the rate measured over them (racing threads may skip or repeat a retune: harmless)."""
        seen = next(self.seen)
        if seen and seen % RETUNE_EVERY == 0:
            now = time.monotonic()
            rate = RETUNE_EVERY / max(now - self._since, 1e-6)
            self._since = now
            self.every = max(1, math.ceil(rate / MAX_SAMPLED_RPS))
        return seen % self.every == 0

    def refused_since(self) -> int:
        now = sum(REFUSED[name] for name in self.inputs)
        delta, self.refused = now - self.refused, now
        return delta

    def refused_pending(self) -> int:
        """The refusals :meth:`refused_since` would hand the next report (reading them only)."""
        return sum(REFUSED[name] for name in self.inputs) - self.refused


class DriftMonitor:
    """One per agent: the tap of each model's server, and the telemetry's quality figures."""

    def __init__(self, models: Any) -> None:
        self.models = models  # agent/device_models.py's DeviceModels
        self._models: dict[str, _Sampled] = {}
        self._lock = threading.Lock()  # making a model's window; counting takes the window's own
        # /metrics: each model's counts of the windows closed so far, and its last closed window.
        self._totals: dict[str, Counter[str]] = {}
        self._last: dict[str, ModelQuality] = {}
        self._closing = threading.Lock()  # a window's close and its totals, seen together
        self._telemetry = False  # whether a telemetry link takes the windows (reports())

    def attach(self, server: AnswerTaps) -> None:
        """Count every answer of ``server`` (its model's and nothing else); once per server."""
        if self.tap not in server.taps:
            server.taps.append(self.tap)

    def on_event(self, name: str, detail: dict[str, Any]) -> None:
        """A model (re)loaded: watch its server, and read its bundle's reference again."""
        if name != "model_loaded" or not isinstance(detail.get("model"), str):
            return
        try:
            self.attach(self.models.entry(detail["model"]).server)
        except EdgeSDKError:
            return
        with self._lock:
            retired = self._models.pop(detail["model"], None)
        if retired is not None:
            self._close(detail["model"], retired, keep=False)

    def tap(
        self, model_name: str, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], variant_id: str
    ) -> None:
        sampled = self._models.get(model_name) or self._start(model_name)
        if sampled is not None and sampled.due():
            sampled.window.add(feeds, outputs)

    def reports(self) -> dict[str, ModelQuality]:
        """Each serving model's figures since the last call (telemetry calls it once a report).

        A model that answered nothing and refused nothing since is left out, its window going
        on: an empty window says nothing about drift, and the fleet reads a report without
        scores as the end of a drifted run (a pause in the traffic would restart the alert's
        10 minutes)."""
        self._telemetry = True
        found: dict[str, ModelQuality] = {}
        for entry in self.models.entries():
            sampled = self._serving(entry)
            if sampled is None:
                continue
            agreement = self._agreement(entry)
            if sampled.window.samples == 0 and sampled.refused_pending() == 0 and agreement is None:
                continue
            quality = self._close(entry.name, sampled)
            found[entry.name] = quality if agreement is None else quality.model_copy(update={"agreement": agreement})
        return found

    def readouts(self) -> dict[str, DriftReadout]:
        """Each serving model's drift for ``/metrics``, leaving the telemetry's windows alone."""
        found: dict[str, DriftReadout] = {}
        for entry in self.models.entries():
            sampled = self._serving(entry)
            if sampled is None:
                continue
            if not self._telemetry and time.monotonic() - sampled.window.started >= ROLL_S:
                self._close(entry.name, sampled)
            with self._closing:
                current = sampled.window.peek(refused_nonfinite=sampled.refused_pending())
                requests = self._totals.get(entry.name, Counter()) + _counts(current)
            scored = current.inputs or current.outputs
            shown = current if scored else self._last.get(entry.name, current)
            found[entry.name] = DriftReadout(shown, {kind: requests[kind] for kind in REQUEST_KINDS})
        return found

    def _serving(self, entry: Any) -> _Sampled | None:
        """The window of the bundle ``entry`` serves now (a new bundle: a new reference, counts from now)."""
        served = entry.server.model
        if served is None:
            return None
        sampled = self._models.get(entry.name)
        if sampled is None or sampled.window.key != served.bundle_sha256:
            sampled = self._start(entry.name)
        return sampled

    def _close(self, name: str, sampled: _Sampled, keep: bool = True) -> ModelQuality:
        """Close ``sampled``'s window: its counts join the model's totals, and unless the model
        was replaced (``keep``), its scores are the ones /metrics shows until the next is scored."""
        with self._closing:
            quality = sampled.window.report(refused_nonfinite=sampled.refused_since())
            self._totals.setdefault(name, Counter()).update(_counts(quality))
        if keep:
            self._last[name] = quality
        return quality

    def _agreement(self, entry: Any) -> Any:
        """The model's shadow agreement while a probation's shadow runs, else None."""
        servers = (self.models.default_server, entry.server)
        taps = [tap for server in servers for tap in server.taps]
        return live_agreement(taps, entry.name)

    def _start(self, name: str) -> _Sampled | None:
        with self._lock:
            try:
                entry = self.models.entry(name)
            except EdgeSDKError:
                return None
            served = entry.server.model
            if served is None:
                return None
            current = self._models.get(name)
            if current is not None and current.window.key == served.bundle_sha256:
                return current
            if current is not None:  # its counts stay in the totals; its scores were another bundle's
                self._close(name, current, keep=False)
                self._last.pop(name, None)
            try:
                profile = installed_reference(entry.store, served.bundle_sha256)
            except (EdgeSDKError, OSError) as exc:
                log.warning("model %s: its reference profile is not readable (%s); counts only", name, exc)
                profile = None
            inputs = [slot.name for slot in served.signature.inputs]
            sampled = _Sampled(ModelWindow(profile, key=served.bundle_sha256), inputs)
            self._models[name] = sampled
            return sampled


def watch_drift(models: Any, events: Any, metrics: Any) -> DriftMonitor:
    """The agent's drift monitor: on the default model's server now, on each other model's when it
    loads (``model_loaded``), its figures in every telemetry report (agent/daemon.py calls this
    once, before any model loads)."""
    monitor = DriftMonitor(models)
    monitor.attach(models.default_server)
    events.subscribe(monitor.on_event)  # every model loads after this (and makes no entry here)
    metrics.attach_quality(monitor.reports, readouts=monitor.readouts)
    return monitor
