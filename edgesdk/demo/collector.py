"""Samples every agent's ``/v1/status`` and ``/metrics`` on a thread while the demo runs.

What the fleet report plots comes from here: per device, over time, the hottest sensor, the
variant and precision serving, the release, the governor and OTA states, and the agent's own
p50/p95 latency (from its Prometheus metrics). Requests are loopback only.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

_QUANTILE = re.compile(
    r'^edgesdk_agent_inference_latency_seconds\{variant="(?P<variant>[^"]+)",quantile="(?P<q>[0-9.]+)"\} (?P<v>\S+)$'
)


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


def parse_latency(metrics_text: str) -> dict[str, dict[str, float]]:
    """``{variant: {"0.5": ms, "0.95": ms, ...}}`` from the agent's Prometheus text."""
    found: dict[str, dict[str, float]] = {}
    for line in metrics_text.splitlines():
        match = _QUANTILE.match(line.strip())
        if match:
            found.setdefault(match["variant"], {})[match["q"]] = float(match["v"]) * 1000.0
    return found


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback URLs we built
        return response.read()


def sample_agent(url: str, t: float) -> Sample:
    """Read one device's status and metrics (raises OSError/ValueError when it does not answer)."""
    status = json.loads(_get(f"{url}/v1/status"))
    latency = parse_latency(_get(f"{url}/metrics").decode())
    model = status.get("model") or {}
    governor = status.get("governor") or {}
    updates = status.get("updates") or {}
    temps = [float(v) for v in (status.get("temperatures_c") or {}).values()]
    variant = model.get("variant")
    quantiles = latency.get(variant or "", {})
    return Sample(
        t=t,
        temperature_c=max(temps) if temps else None,
        variant=variant,
        precision=model.get("precision"),
        release=model.get("release"),
        version=model.get("version"),
        governor=governor.get("state"),
        ota_state=updates.get("state") if isinstance(updates, dict) else None,
        p50_ms=quantiles.get("0.5"),
        p95_ms=quantiles.get("0.95"),
    )


class Collector:
    """Polls every agent every ``interval_s`` until stopped."""

    def __init__(self, agents: dict[str, str], *, started: float, interval_s: float = 0.5) -> None:
        self.agents = dict(agents)  # device id -> base URL
        self.started = started
        self.interval_s = interval_s
        self.series = {device: DeviceSeries(device) for device in agents}
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
                sample = sample_agent(url, time.monotonic() - self.started)
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
