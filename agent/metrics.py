"""What the agent measures about itself, kept in memory, served as ``/metrics`` and handed
to the MQTT link as telemetry.

Latency is recorded per variant into a bounded rolling window (the last ``window_s``
seconds, at most ``max_samples`` samples), so percentiles follow what the device does now
and memory stays flat however long it runs. Recording is two deque appends of floats from
the inference thread (~0.5 MB per variant once 8192 samples are held; a deque of
(time, seconds) tuples held ~0.9 MB, and ring buffers of doubles, 128 KiB, cost ~6 µs more
per request once a large model's run has left the caches cold); percentiles are computed
only when someone asks.

For Prometheus, each variant also counts its latencies into fixed histogram buckets
(``LATENCY_BUCKETS_S``): cumulative since start, so a fleet can ``rate()`` and aggregate them
(``histogram_quantile`` over many devices), which rolling quantiles cannot do.

``observe`` only queues the sample (variant, seconds, time: one deque append, thread-safe);
every reader, and ``observe`` itself each ``_SETTLE_EVERY`` samples, first folds what is queued
into the windows and buckets in bulk (``settle``: deque extends and one numpy bucket count).
An earlier session measured, on a micro-benchmark with warm caches, folding lazily saving ~40 ns of a
~265 ns ``observe`` (bisect, two appends, the sum); under wrk, where the kernel and the client
leave the caches cold between answers, recording each sample as it came and the inline
decision's update together cost the tiny model's answer ~3 µs of ~78 µs of CPU (BENCHMARKS.md,
issue 15, ninth session).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from edgesdk.agent.ports import ConnectionGauge, GovernorReadout, ModelsReadout, OutboxGauge, Serving

from edgesdk.errors import AgentError
from edgesdk.schemas.measurements import DeviceMeasurements
from edgesdk.schemas.messages import ModelQuality, RunningModel

log = logging.getLogger("edgesdk.agent.metrics")

#: Upper bounds (seconds) of the latency histogram's buckets, +Inf implied. From 100 µs (a
#: tiny model's run on a Pi-class CPU is tens to hundreds of µs) to 10 s (a large model on a
#: throttled board), about three per decade so ``histogram_quantile`` stays within ~2.5x.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_BUCKET_BOUNDS = np.asarray(LATENCY_BUCKETS_S)
#: Tensors per model and direction with drift series on /metrics: tensor names come from a
#: signed bundle (at most 64 each way), but every name is a series; past this many the first
#: ones by name are listed (telemetry carries them all).
MAX_DRIFT_TENSORS = 16
#: Samples ``observe`` queues before it folds them itself (readers fold what is there first).
_SETTLE_EVERY = 256

# Bound once: observe() runs per request, and a module attribute lookup there is measurable.
_monotonic = time.monotonic


class LatencyWindow:
    """Latencies of one variant: the last ``max_samples`` monotonic times and durations (rolling
    quantiles), and histogram bucket counts and their sum since start (Prometheus)."""

    def __init__(self, max_samples: int) -> None:
        self.times: deque[float] = deque(maxlen=max_samples)
        self.seconds: deque[float] = deque(maxlen=max_samples)
        # Per bucket, NOT cumulative (one increment per sample); the last one is +Inf.
        self.bucket_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    @property
    def total(self) -> int:
        """Samples recorded since start."""
        return sum(self.bucket_counts)

    def recent(self, since: float) -> np.ndarray:
        # list() snapshots each deque (safe in CPython while another thread appends). A writer
        # between its two appends can pair one sample with its neighbour's time: harmless for
        # rolling quantiles, and no lock on the hot path.
        times = np.array(list(self.times), dtype=np.float64)
        seconds = np.array(list(self.seconds), dtype=np.float64)
        n = min(times.size, seconds.size)
        return seconds[:n][times[:n] >= since]


class InferenceStats:
    """What the model server records on its hot path: latency per variant and errors by kind."""

    def __init__(self, *, window_s: float = 60.0, max_samples: int = 8192) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self.started = time.monotonic()
        self._windows: dict[str, LatencyWindow] = {}
        self._errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        # (variant id, seconds, monotonic time) queued by observe, folded by settle.
        self._unsettled: deque[tuple[str, float, float]] = deque()
        self._settle_lock = threading.Lock()

    # -- recording (hot path) -------------------------------------------------------------------

    def observe(self, variant_id: str, seconds: float) -> None:
        """One successful inference of ``variant_id`` that took ``seconds``: queued, folded by
        the next reader or every ``_SETTLE_EVERY`` samples (see the module docstring)."""
        unsettled = self._unsettled
        unsettled.append((variant_id, seconds, _monotonic()))
        if len(unsettled) >= _SETTLE_EVERY:
            self.settle()

    def settle(self) -> None:
        """Fold the samples ``observe`` queued into each variant's window and buckets. Safe from
        any thread: one settles at a time, each taking the samples queued when it began
        (appends meanwhile wait for the next); the windows' order of times does not matter
        (``recent`` filters them)."""
        with self._settle_lock:
            unsettled = self._unsettled
            pop = unsettled.popleft
            samples = [pop() for _ in range(len(unsettled))]
            if not samples:
                return
            variant_ids, seconds, times = zip(*samples)
            if variant_ids.count(variant_ids[0]) == len(variant_ids):  # the usual case: one variant
                self._fold(variant_ids[0], seconds, times)
                return
            by_variant: dict[str, tuple[list[float], list[float]]] = {}
            for variant_id, took, when in samples:
                durations, whens = by_variant.setdefault(variant_id, ([], []))
                durations.append(took)
                whens.append(when)
            for variant_id, (durations, whens) in by_variant.items():
                self._fold(variant_id, durations, whens)

    def _fold(self, variant_id: str, seconds: Sequence[float], times: Sequence[float]) -> None:
        window = self._windows.get(variant_id)
        if window is None:
            with self._lock:
                window = self._windows.setdefault(variant_id, LatencyWindow(self.max_samples))
        window.times.extend(times)
        window.seconds.extend(seconds)
        # searchsorted "left": the first bound >= seconds, i.e. Prometheus' "le" (less than or equal).
        counts = np.bincount(np.searchsorted(_BUCKET_BOUNDS, seconds, side="left"), minlength=len(_BUCKET_BOUNDS) + 1)
        buckets = window.bucket_counts
        for index in np.flatnonzero(counts).tolist():
            buckets[index] += int(counts[index])
        window.sum_s += sum(seconds)

    def count_error(self, kind: str) -> None:
        """One failed request, by kind (bad_input, not_found, overload, timeout, runtime, ...)."""
        with self._lock:
            self._errors[kind] += 1

    # -- reading ----------------------------------------------------------------------------------

    def latency(self) -> dict[str, dict[str, Any]]:
        self.settle()
        since = time.monotonic() - self.window_s
        stats: dict[str, dict[str, Any]] = {}
        for variant_id, window in list(self._windows.items()):
            recent = window.recent(since)
            if recent.size:
                p50, p95, p99 = np.percentile(recent, [50, 95, 99]) * 1000.0
                stats[variant_id] = {
                    "count": int(recent.size),
                    "p50_ms": round(float(p50), 4),
                    "p95_ms": round(float(p95), 4),
                    "p99_ms": round(float(p99), 4),
                }
            else:
                stats[variant_id] = {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None}
        return stats

    def throughput_rps(self) -> float:
        self.settle()
        now = time.monotonic()
        span = min(self.window_s, max(now - self.started, 1e-3))
        since = now - span
        count = sum(int(w.recent(since).size) for w in list(self._windows.values()))
        return round(count / span, 3)

    def totals(self) -> dict[str, int]:
        self.settle()
        return {variant_id: w.total for variant_id, w in list(self._windows.items())}

    def errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._errors)

    def windows(self) -> list[tuple[str, LatencyWindow]]:
        """Each variant's latency window, by variant id (a copy of the mapping, safe to iterate)."""
        self.settle()
        return sorted(self._windows.items())


class RequestsInFlight:
    """Inference requests running or waiting in the local API (``queue_depth``).

    The API counts into it on its event loop thread; /metrics and telemetry read it. It is a
    value of its own, not a callable slot, so no other part can re-point what it means."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class Metrics:
    """The agent's measurements, assembled from the parts that know them.

    Built with its sources: ``serving`` (what serves, how often it switched), ``stats`` (the
    latency and errors the server records; a fresh one when not given), ``governor`` (its
    state and last sensor reading). The API counts its requests into :attr:`requests`. The
    MQTT outbox starts after the model loads (and only with a link), so the daemon attaches
    it then with :meth:`attach_outbox`.
    """

    def __init__(
        self,
        serving: Serving | None = None,
        *,
        stats: InferenceStats | None = None,
        governor: GovernorReadout | None = None,
        measured: Callable[[], DeviceMeasurements | None] | None = None,
        window_s: float = 60.0,
        max_samples: int = 8192,
    ) -> None:
        self.serving = serving
        self.stats = stats or InferenceStats(window_s=window_s, max_samples=max_samples)
        self.governor = governor
        self.measured = measured or (lambda: None)  # what on-device profiling measured, for telemetry
        self.requests = RequestsInFlight()
        #: Inferences of a tiny model answered on the event loop in a batch of two or more
        #: (``api.inline_batch_max``; agent/api/prepared.py), counted on the loop's thread.
        self.inline_batched = 0
        self.outbox: OutboxGauge | None = None
        self.http: ConnectionGauge | None = None  # the local API's HTTP server (attach_http)
        self.models: ModelsReadout | None = None  # every model of the device (attach_models)
        self._quality: Callable[[], dict[str, ModelQuality]] | None = None  # attach_quality
        self._drift: Callable[[], dict[str, Any]] | None = None  # its DriftReadout per model, for /metrics
        self.started = time.monotonic()
        self._process: Any = None
        try:
            import psutil

            self._process = psutil.Process(os.getpid())
            self._process.cpu_percent(None)  # prime: the first call always returns 0.0
        except ImportError:
            self._process = None

    def attach_outbox(self, outbox: OutboxGauge) -> None:
        """Report the MQTT outbox (``outbox_depth``, dropped messages) from now on."""
        if self.outbox is not None and self.outbox is not outbox:
            raise AgentError("metrics already report an MQTT outbox; one agent has one link")
        self.outbox = outbox

    def attach_http(self, http: ConnectionGauge) -> None:
        """Report the local API's connections (``edgesdk_agent_http_connections_*``) from now on."""
        self.http = http

    def attach_quality(
        self, reports: Callable[[], dict[str, ModelQuality]], readouts: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """Take each telemetry report's drift and data-quality figures from ``reports``, and the
        ``edgesdk_agent_drift_*`` families from ``readouts`` (agent/drift/monitor.py)."""
        self._quality = reports
        self._drift = readouts

    def quality_reports(self) -> dict[str, ModelQuality]:
        """Each model's ``ModelQuality`` since the last call, by name: the MQTT link calls it once
        per telemetry message (each call starts a new window, so nothing else may)."""
        return self._quality() if self._quality is not None else {}

    def attach_models(self, models: ModelsReadout) -> None:
        """Report each model of the device (telemetry ``models``, the ``edgesdk_agent_model_*`` series)."""
        self.models = models

    @property
    def window_s(self) -> float:
        return self.stats.window_s

    # -- recording: the stats' (kept here so a part holding Metrics can record) ----------------

    def observe(self, variant_id: str, seconds: float) -> None:
        """One successful inference of ``variant_id`` that took ``seconds``."""
        self.stats.observe(variant_id, seconds)

    def count_error(self, kind: str) -> None:
        """One failed request, by kind (bad_input, not_found, overload, timeout, runtime, ...)."""
        self.stats.count_error(kind)

    # -- reading ----------------------------------------------------------------------------------

    def latency(self) -> dict[str, dict[str, Any]]:
        return self.stats.latency()

    def throughput_rps(self) -> float:
        return self.stats.throughput_rps()

    def totals(self) -> dict[str, int]:
        return self.stats.totals()

    def errors(self) -> dict[str, int]:
        return self.stats.errors()

    def process(self) -> tuple[float | None, float | None]:
        """(CPU percent since the last call, RSS in MB) of the agent process."""
        if self._process is None:
            return None, None
        import psutil

        try:
            cpu = float(self._process.cpu_percent(None))
            rss = self._process.memory_info().rss / (1024 * 1024)
        except (psutil.Error, OSError) as exc:
            # Some containers hide /proc/self/stat: say so once, then stop asking every scrape.
            log.warning("process CPU and memory are not readable here (%s); not reported from now on", exc)
            self._process = None
            return None, None
        return round(cpu, 2), round(rss, 2)

    def running_model(self) -> RunningModel | None:
        """What is serving (the serving part's answer; None without one)."""
        return self.serving.running_model() if self.serving is not None else None

    def snapshot(self) -> dict[str, Any]:
        """The Telemetry fields (schemas.messages.Telemetry) the agent itself knows: all but
        device_id, msg_id, seq, ts and the link's own (outbox_depth, dropped_messages)."""
        cpu, rss = self.process()
        reading = self.governor.last_reading if self.governor is not None else None
        return {
            "model": self.running_model(),
            "latency": self.latency(),
            "throughput_rps": self.throughput_rps(),
            "errors": self.errors(),
            "queue_depth": self.requests.count,
            "cpu_percent": cpu,
            "rss_mb": rss,
            "temperatures_c": {k: float(v) for k, v in reading.temperatures_c.items()} if reading else {},
            "power_source": reading.power_source
            if reading and reading.power_source in ("ac", "battery")
            else "unknown",
            "governor_state": self.governor.state if self.governor is not None else None,
            "switch_count": self.serving.switch_count if self.serving is not None else 0,
            **self._models_snapshot(),
            "measured": figures.summary() if (figures := self.measured()) is not None else None,
        }

    def _models_snapshot(self) -> dict[str, Any]:
        """Telemetry's per-model fields: each serving model's figures, the budget, what is resident."""
        models = self.models
        if models is None:
            return {}
        per_model = []
        for entry in models.entries():
            running = entry.running_model()
            if running is None:
                continue
            stats = entry.stats
            per_model.append(
                {
                    "model": running,
                    "latency": stats.latency(),
                    "throughput_rps": stats.throughput_rps(),
                    "errors": stats.errors(),
                    "resident_mb": entry.resident_mb(),
                }
            )
        memory = models.memory()
        return {"models": per_model, "model_budget_mb": memory["model_budget_mb"], "resident_mb": memory["resident_mb"]}

    def prometheus(self) -> str:
        """The snapshot in the Prometheus text exposition format (version 0.0.4)."""
        snap = self.snapshot()
        out: list[str] = []

        def metric(
            name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float | int | None]]
        ) -> None:
            out.append(f"# HELP edgesdk_agent_{name} {help_text}")
            out.append(f"# TYPE edgesdk_agent_{name} {kind}")
            for labels, value in samples:
                if value is None:
                    continue
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                out.append(
                    f"edgesdk_agent_{name}{{{label_text}}} {value}" if label_text else f"edgesdk_agent_{name} {value}"
                )

        self._latency_histogram(out)
        metric(
            "inferences_total",
            "counter",
            "successful inferences per variant",
            [({"variant": v}, n) for v, n in self.totals().items()],
        )
        metric("throughput_rps", "gauge", "inferences per second over the window", [({}, snap["throughput_rps"])])
        metric(
            "errors_total",
            "counter",
            "failed requests by kind",
            [({"kind": k}, n) for k, n in sorted(snap["errors"].items())],
        )
        metric(
            "inline_batched_inferences_total",
            "counter",
            "inferences answered on the event loop in a batch of two or more requests (api.inline_batch_max)",
            [({}, self.inline_batched)],
        )
        metric(
            "queue_depth",
            "gauge",
            "inference requests running or waiting in the local API",
            [({}, snap["queue_depth"])],
        )
        outbox = self.outbox
        if outbox is not None:
            metric(
                "mqtt_outbox_messages",
                "gauge",
                "messages in the MQTT store-and-forward outbox, not yet acknowledged by the broker",
                [({}, outbox.depth)],
            )
            metric(
                "mqtt_outbox_dropped_total",
                "counter",
                "messages the MQTT outbox dropped (oldest first) to stay within its disk quota",
                [({}, outbox.dropped)],
            )
        http = self.http
        if http is not None:
            metric(
                "http_connections_open",
                "gauge",
                "open connections of the local HTTP API",
                [({}, http.open_connections)],
            )
            metric(
                "http_connections_refused_total",
                "counter",
                "connections answered 503 as they opened, before any request of theirs was read "
                "(api.max_connections with none to close, api.max_connections_per_client)",
                [({}, http.refused)],
            )
            metric(
                "http_connections_evicted_total",
                "counter",
                "connections closed to make room for a new one past api.max_connections "
                "(inside an unfinished header block first, then idle ones)",
                [({}, http.evicted)],
            )
        metric("cpu_percent", "gauge", "CPU of the agent process", [({}, snap["cpu_percent"])])
        rss = snap["rss_mb"]
        metric("rss_bytes", "gauge", "resident memory of the agent", [({}, int(rss * 1024 * 1024) if rss else None)])
        metric(
            "temperature_celsius",
            "gauge",
            "sensor temperatures",
            [({"sensor": k}, v) for k, v in sorted(snap["temperatures_c"].items())],
        )
        metric("power_source", "gauge", "1 for the current power source", [({"source": snap["power_source"]}, 1)])
        metric("precision_switches_total", "counter", "precision switches since start", [({}, snap["switch_count"])])
        if snap["governor_state"]:
            metric("governor_state", "gauge", "1 for the governor's state", [({"state": snap["governor_state"]}, 1)])
        model = snap["model"]
        if model:
            metric(
                "model_info",
                "gauge",
                "the model now serving (sha256 of the active artifact)",
                [
                    (
                        {
                            "model": model.name,
                            "version": model.version,
                            "release": str(model.release),
                            "variant": model.variant,
                            "sha256": model.sha256,
                        },
                        1,
                    )
                ],
            )
        self._per_model_series(metric, out)
        self._drift_series(metric)
        metric(
            "uptime_seconds",
            "gauge",
            "seconds since the agent started",
            [({}, round(time.monotonic() - self.started, 1))],
        )
        return "\n".join(out) + "\n"

    def _per_model_series(self, metric: Callable[..., None], out: list[str]) -> None:
        """The ``edgesdk_agent_model_*`` families: every model's latency, inferences and errors
        (labels ``model`` and ``variant`` / ``kind``), resident size and the budget. The families
        without a ``model`` label above are the default model's (and the API's own refusals)."""
        models = self.models
        if models is None:
            return
        entries = [(e.name, e.stats) for e in models.entries() if e.running_model() is not None]
        self._latency_histogram(
            out, "edgesdk_agent_model_inference_latency_seconds", [(name, stats) for name, stats in entries]
        )
        metric(
            "model_inferences_total",
            "counter",
            "successful inferences per model and variant",
            [({"model": name, "variant": v}, n) for name, stats in entries for v, n in stats.totals().items()],
        )
        metric(
            "model_errors_total",
            "counter",
            "failed requests per model, by kind",
            [({"model": name, "kind": k}, n) for name, stats in entries for k, n in sorted(stats.errors().items())],
        )
        memory = models.memory()
        metric(
            "model_resident_bytes",
            "gauge",
            "load size of the variants each model holds",
            [({"model": name}, int(mb * 2**20)) for name, mb in memory["models"].items()],
        )
        metric(
            "model_budget_bytes",
            "gauge",
            "the device profile's model memory budget, shared by every model",
            [({}, int(memory["model_budget_mb"] * 2**20))],
        )

    def _drift_series(self, metric: Callable[..., None]) -> None:
        """The ``edgesdk_agent_drift_*`` families: each model's drift score per tensor and metric
        (the window under way once scored, else the last one), its requests by kind since start."""
        if self._drift is None:
            return
        readouts = self._drift()
        scores: list[tuple[dict[str, str], float | None]] = []
        for name, readout in sorted(readouts.items()):
            for direction, tensors in (("input", readout.scores.inputs), ("output", readout.scores.outputs)):
                for tensor, score in sorted(tensors.items())[:MAX_DRIFT_TENSORS]:
                    labels = {"model": name, "direction": direction, "tensor": tensor}
                    scores += [({**labels, "metric": m}, getattr(score, m)) for m in ("psi", "js", "ks")]
        metric(
            "drift_score",
            "gauge",
            "drift of a tensor's live values from the bundle's reference profile, worst channel: metric=psi "
            "(population stability index), js (Jensen-Shannon distance, base 2), ks (Kolmogorov-Smirnov on "
            "the binned CDFs)",
            scores,
        )
        metric(
            "drift_window_seconds",
            "gauge",
            "seconds of traffic the drift scores cover",
            [({"model": name}, r.scores.window_s) for name, r in sorted(readouts.items())],
        )
        metric(
            "drift_requests_total",
            "counter",
            "requests per model since start, by kind: sampled (counted into the drift bins), nonfinite "
            "(refused for NaN/Inf), out_of_range (outside the reference's range), constant (every value the same)",
            [({"model": name, "kind": k}, n) for name, r in sorted(readouts.items()) for k, n in r.requests.items()],
        )

    def _latency_histogram(
        self,
        out: list[str],
        name: str = "edgesdk_agent_inference_latency_seconds",
        sources: list[tuple[str | None, InferenceStats]] | None = None,
    ) -> None:
        """``name`` as a histogram: per variant (and model, for the per-model family), cumulative
        ``_bucket{le}`` counts, ``_sum`` and ``_count`` since start."""
        per = "per model and variant" if sources is not None else "per variant"
        out.append(f"# HELP {name} duration of successful inferences (the model's run) {per}")
        out.append(f"# TYPE {name} histogram")
        bounds = [f"{b:g}" for b in LATENCY_BUCKETS_S] + ["+Inf"]
        for model_name, stats in sources if sources is not None else [(None, self.stats)]:
            for variant_id, window in stats.windows():
                # Copied first: a pool thread may add a sample while this runs.
                counts = list(window.bucket_counts)
                total_s = window.sum_s
                labels = f'variant="{_escape(variant_id)}"'
                if model_name is not None:
                    labels = f'model="{_escape(model_name)}",{labels}'
                cumulative = 0
                for bound, count in zip(bounds, counts):
                    cumulative += count
                    out.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
                out.append(f"{name}_sum{{{labels}}} {total_s!r}")
                out.append(f"{name}_count{{{labels}}} {cumulative}")


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
