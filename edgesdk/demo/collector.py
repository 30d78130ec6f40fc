"""Samples every agent's ``/v1/status`` and ``/metrics`` on a thread while the demo runs.

What the fleet report plots comes from here: per device, over time, the hottest sensor, the
variant and precision serving, the release, the governor and OTA states, and the agent's own
p50/p95 latency. The latency is read the way Prometheus would: the agent exports a cumulative
histogram, and each sample's quantiles come from the buckets' increase over the last few
seconds of scrapes (``histogram_quantile(q, rate(..._bucket[5s]))``). Requests are loopback only.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field

_BUCKET = re.compile(r"^edgesdk_agent_inference_latency_seconds_bucket\{(?P<labels>[^}]*)\} (?P<v>\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")

#: Per variant: (upper bound in seconds, cumulative count), ascending, ending with +Inf.
Histograms = dict[str, list[tuple[float, float]]]


@dataclass
class Sample:
    """One look at one device."""

    t: float  # seconds since the demo started
    temperature_c: float | None
    variant: str | None
    precision: str | None
    release: int | None
    version: str | None
    governor: str | None
    ota_state: str | None
    p50_ms: float | None
    p95_ms: float | None


@dataclass
class DeviceSeries:
    device_id: str
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0


def parse_latency_histograms(metrics_text: str) -> Histograms:
    """``{variant: [(le, cumulative count), ...]}`` from the agent's Prometheus text."""
    found: Histograms = {}
    for line in metrics_text.splitlines():
        match = _BUCKET.match(line.strip())
        if not match:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if "variant" in labels and "le" in labels:
            variant = _UNESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], labels["variant"])
            found.setdefault(variant, []).append((float(labels["le"]), float(match["v"])))
    return {variant: sorted(buckets) for variant, buckets in found.items()}


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: the ``q`` quantile (seconds) of cumulative buckets,
    interpolated linearly inside the bucket it falls in; None without observations. A quantile
    in the +Inf bucket is the highest finite bound (all that is known)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


class LatencyRate:
    """Each variant's bucket increase over the last ``window_s`` of scrapes of one agent."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._scrapes: deque[tuple[float, Histograms]] = deque()

    def update(self, t: float, histograms: Histograms) -> Histograms:
        """Record a scrape at ``t``; returns the increase since the last scrape at least
        ``window_s`` old (or the oldest one kept), or everything since the agent started on the
        first scrape or after it restarted."""
        while len(self._scrapes) > 1 and self._scrapes[1][0] <= t - self.window_s:
            self._scrapes.popleft()
        base = self._scrapes[0][1] if self._scrapes else {}
        self._scrapes.append((t, histograms))
        increase: Histograms = {}
        for variant, buckets in histograms.items():
            before = dict(base.get(variant, []))
            delta = [(le, count - before.get(le, 0.0)) for le, count in buckets]
            if any(count < 0 for _, count in delta):  # counters went back: the agent restarted
                delta = list(buckets)
            increase[variant] = delta
        return increase


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback URLs we built
        return response.read()


def sample_agent(url: str, t: float, rate: LatencyRate | None = None) -> Sample:
    """Read one device's status and metrics (raises OSError/ValueError when it does not answer).
    ``rate`` keeps this device's recent scrapes; without it the quantiles are since start."""
    status = json.loads(_get(f"{url}/v1/status"))
    histograms = parse_latency_histograms(_get(f"{url}/metrics").decode())
    latency = rate.update(t, histograms) if rate is not None else histograms
    model = status.get("model") or {}
    governor = status.get("governor") or {}
    updates = status.get("updates") or {}
    temps = [float(v) for v in (status.get("temperatures_c") or {}).values()]
    variant = model.get("variant")
    buckets = latency.get(variant or "", [])
    p50, p95 = histogram_quantile(0.5, buckets), histogram_quantile(0.95, buckets)
    return Sample(
        t=t,
        temperature_c=max(temps) if temps else None,
        variant=variant,
        precision=model.get("precision"),
        release=model.get("release"),
        version=model.get("version"),
        governor=governor.get("state"),
        ota_state=updates.get("state") if isinstance(updates, dict) else None,
        p50_ms=p50 * 1000.0 if p50 is not None else None,
        p95_ms=p95 * 1000.0 if p95 is not None else None,
    )


class Collector:
    """Polls every agent every ``interval_s`` until stopped."""

    def __init__(self, agents: dict[str, str], *, started: float, interval_s: float = 0.5) -> None:
        self.agents = dict(agents)  # device id -> base URL
        self.started = started
        self.interval_s = interval_s
        self.series = {device: DeviceSeries(device) for device in agents}
        self.rates = {device: LatencyRate() for device in agents}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-collector", daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def latest(self, device_id: str) -> Sample | None:
        with self._lock:
            samples = self.series[device_id].samples
            return samples[-1] if samples else None

    def snapshot(self) -> dict[str, list[Sample]]:
        with self._lock:
            return {device: list(s.samples) for device, s in self.series.items()}

    def poll_once(self) -> None:
        for device, url in self.agents.items():
            try:
                sample = sample_agent(url, time.monotonic() - self.started, self.rates[device])
            except (OSError, ValueError, urllib.error.URLError):
                with self._lock:
                    self.series[device].errors += 1
                continue
            with self._lock:
                self.series[device].samples.append(sample)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval_s)
