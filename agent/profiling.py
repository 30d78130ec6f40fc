"""On-device profiling (``edge-agent profile``): time every variant of the installed bundle on
this device, and derive the precision ladder from what was measured.

Host timings (and the profile's expectations) can be wrong for a given board: an int8 variant
that runs slower than fp16 *here* (onnxruntime's dynamic int8 on some CPUs, an unfused QDQ
graph) is no speed step, and stepping down to it when hot would cost accuracy for nothing. So
each runtime the profile lists (and any other the variants use) is imported first (timed, with
the resident memory it adds and the disk its distribution takes: its footprint on this board,
which the planner counts against the board's budgets), then each variant is loaded (decrypt + runtime session, in memory, timed, with the
resident memory it added), warmed up, then run a fixed number of times on the bundle's golden input; the ladder
keeps a lower precision only when its fastest variant beat the step above it.

The figures are written to ``DATA_DIR/measurements.json`` (never a model byte), and shown in
``/v1/status`` under ``measured``.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import AgentError, EdgeSDKError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.schemas.common import PRECISION_LADDER, Precision
from edgesdk.schemas.measurements import DeviceMeasurements, RuntimeFootprint, VariantMeasurement

log = logging.getLogger("edgesdk.agent.profiling")

MEASUREMENTS_FILE = "measurements.json"
DEFAULT_WARMUP = 5
DEFAULT_RUNS = 50
#: Interleaved timing rounds per variant (A B A B A B, one variant loaded at a time): a burst of
#: other work on the device (a package update, a cron job) falls in one round, and the median of
#: the rounds' medians ignores it; a rung is dropped only when it is slower in most rounds.
DEFAULT_ROUNDS = 3

#: ``open(variant_id) -> a model with .run(feeds) and .close()``, timed as "load".
OpenVariant = Callable[[str], Any]


def _rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def time_runs(
    run: Callable[[], object], *, warmup: int, runs: int, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Milliseconds of each of ``runs`` calls of ``run``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        started = clock()
        run()
        times.append((clock() - started) * 1000.0)
    return times


def speed_ladder(measured: Sequence[VariantMeasurement]) -> tuple[list[str], dict[str, str]]:
    """The variants the governor steps through, highest precision first, and why the others are not.

    Per precision the fastest variant (by median) represents it; a precision is a step only when
    that variant is faster than the last step kept."""
    steps: list[VariantMeasurement] = []
    not_steps: dict[str, str] = {}
    for precision in PRECISION_LADDER:
        group = [m for m in measured if Precision(m.precision) == precision]
        if not group:
            continue
        best = min(group, key=lambda m: m.p50_ms)
        for other in group:
            if other is not best:
                not_steps[other.variant] = (
                    f"slower than {best.variant} at {precision.value} ({other.p50_ms:.3f} vs {best.p50_ms:.3f} ms)"
                )
        if steps and best.p50_ms >= steps[-1].p50_ms:
            not_steps[best.variant] = (
                f"{precision.value} is no faster than {steps[-1].variant} on this device "
                f"({best.p50_ms:.3f} vs {steps[-1].p50_ms:.3f} ms median)"
            )
            continue
        steps.append(best)
    return [s.variant for s in steps], not_steps


def golden_feeds(golden: Mapping[str, np.ndarray], batch: int = 1) -> dict[str, np.ndarray]:
    """The golden set's inputs (its ``output:`` arrays are the expected answers), ``batch`` samples."""
    feeds = {name: array[:batch] for name, array in golden.items() if not name.startswith("output:")}
    if not feeds:
        raise AgentError("the bundle's golden set has no inputs to time the variants with")
    return feeds


#: The module that brings each runtime's native library in (what a variant's first load would pay).
RUNTIME_MODULES = {
    "onnxruntime": "onnxruntime",
    "litert": "ai_edge_litert.interpreter",
    "tflite-runtime": "tflite_runtime.interpreter",
    "openvino": "openvino",
}
#: The distributions that install each runtime, the usual one first (Jetson's is NVIDIA's GPU build).
RUNTIME_DISTRIBUTIONS = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
    "litert": ("ai-edge-litert",),
    "tflite-runtime": ("tflite-runtime",),
    "openvino": ("openvino",),
}


def installed_mb(runtime: str) -> float | None:
    """Disk the runtime's installed distribution takes: the sizes of the files pip recorded for it
    (its RECORD), or None when it is not installed as a distribution here."""
    from importlib import metadata

    for name in RUNTIME_DISTRIBUTIONS.get(runtime, ()):
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        total = 0
        for file in files:
            try:
                total += Path(str(file.locate())).stat().st_size
            except OSError:
                continue  # RECORD lists a file that is gone (or a __pycache__ never written)
        return round(total / 2**20, 2)
    return None


def measure_runtime_imports(
    runtimes: Sequence[str],
    *,
    rss_mb: Callable[[], float] = _rss_mb,
    clock: Callable[[], float] = time.perf_counter,
    import_module: Callable[[str], object] = importlib.import_module,
    disk_mb: Callable[[str], float | None] = installed_mb,
) -> list[RuntimeFootprint]:
    """Import each runtime once, timed, with the resident memory it added (a missing one is skipped:
    its variants then fail to load and say why)."""
    footprints = []
    for runtime in dict.fromkeys(runtimes):
        module = RUNTIME_MODULES.get(runtime)
        if module is None:
            continue
        before = rss_mb()
        started = clock()
        try:
            import_module(module)
        except ImportError as exc:
            log.warning("profile: runtime %s does not import: %s", runtime, exc)
            continue
        footprints.append(
            RuntimeFootprint(
                runtime=runtime,
                import_ms=round((clock() - started) * 1000.0, 3),
                rss_mb=round(rss_mb() - before, 2),
                installed_mb=disk_mb(runtime),
            )
        )
    return footprints


def measure_variants(
    variants: Sequence[Any],
    open_variant: OpenVariant,
    feeds: Mapping[str, np.ndarray],
    *,
    warmup: int = DEFAULT_WARMUP,
    runs: int = DEFAULT_RUNS,
    rss_mb: Callable[[], float] = _rss_mb,
    clock: Callable[[], float] = time.perf_counter,
    rounds: int = DEFAULT_ROUNDS,
) -> tuple[list[VariantMeasurement], dict[str, str]]:
    """Load, warm up and time each variant (manifest ``Variant``), one loaded at a time (so
    resident sizes do not add up), in ``rounds`` interleaved rounds (A B A B …), ``runs`` split
    between them. A variant's median is the median of its rounds' medians: a burst of other work
    on the device lands in one round and moves no figure, while a variant slower in most rounds
    stays slower. A variant that fails to load or run is reported, not fatal."""
    failed: dict[str, str] = {}
    first: dict[str, tuple[float, float]] = {}  # variant id → (load ms, RSS added), from its first load
    times: dict[str, list[list[float]]] = {meta.id: [] for meta in variants}
    count = max(1, min(rounds, runs))  # never a round without a timed run
    for index in range(count):
        share = runs // count + (1 if index < runs % count else 0)
        for meta in variants:
            if meta.id in failed:
                continue
            timed = _time_one(meta, open_variant, feeds, warmup, share, rss_mb if index == 0 else None, clock)
            if isinstance(timed, str):
                failed[meta.id] = timed
                continue
            load_ms, added, round_times = timed
            first.setdefault(meta.id, (load_ms, added))
            times[meta.id].append(round_times)
    batch = len(next(iter(feeds.values())))
    return [
        _figures(meta, first[meta.id], times[meta.id], warmup, runs, batch)
        for meta in variants
        if meta.id not in failed
    ], failed


def _time_one(
    meta: Any,
    open_variant: OpenVariant,
    feeds: Mapping[str, np.ndarray],
    warmup: int,
    runs: int,
    rss_mb: Callable[[], float] | None,
    clock: Callable[[], float],
) -> tuple[float, float, list[float]] | str:
    """One round of one variant: (load ms, RSS added or 0 when not read, run times), or why it failed."""
    gc.collect()
    before = rss_mb() if rss_mb is not None else 0.0
    started = clock()
    try:
        model = open_variant(meta.id)
    except EdgeSDKError as exc:
        log.warning("profile: variant %s does not load: %s", meta.id, exc)
        return f"does not load here: {exc}"
    load_ms = (clock() - started) * 1000.0
    added = rss_mb() - before if rss_mb is not None else 0.0
    try:
        return load_ms, added, time_runs(functools.partial(model.run, feeds), warmup=warmup, runs=runs, clock=clock)
    except EdgeSDKError as exc:
        log.warning("profile: variant %s does not run: %s", meta.id, exc)
        return f"does not run here: {exc}"
    finally:
        model.close()


def _figures(
    meta: Any, loaded: tuple[float, float], rounds: list[list[float]], warmup: int, runs: int, batch: int
) -> VariantMeasurement:
    every = [t for round_times in rounds for t in round_times]
    return VariantMeasurement(
        variant=meta.id,
        runtime=str(getattr(meta.runtime, "value", meta.runtime)),
        precision=str(getattr(meta.precision, "value", meta.precision)),
        format=str(getattr(meta.format, "value", meta.format)),
        load_ms=round(loaded[0], 3),
        rss_mb=round(loaded[1], 2),
        warmup=warmup,
        runs=runs,
        batch=batch,
        p50_ms=round(float(np.median([np.median(r) for r in rounds])), 4),
        p95_ms=round(float(np.percentile(every, 95)), 4),
        mean_ms=round(float(np.mean(every)), 4),
    )


class _Opened:
    """A variant as the server runs it (quantized I/O adapted), and closed when timed."""

    def __init__(self, served: Any) -> None:
        self.served = served

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(self.served.run(feeds))

    def close(self) -> None:
        self.served.loaded.close()


def profile_installed(
    agent: Any, *, warmup: int = DEFAULT_WARMUP, runs: int = DEFAULT_RUNS, emulated: bool = False
) -> DeviceMeasurements:
    """Profile the agent's active bundle (verified again, decrypted in memory) and save the figures."""
    from edgesdk.agent.serving import ServedVariant, gate_passed

    from edgesdk.bundle import decrypt_and_load, decrypt_golden
    from edgesdk.runtimes import load_variant

    verified = agent.store.load_active(agent.trusted_publishers, agent.profile)
    if verified is None:
        raise AgentError("no model is installed: install a bundle first (edge-agent install FILE)")
    golden = decrypt_golden(verified, agent.device_key)
    if golden is None:
        raise AgentError("the installed bundle has no golden set: nothing to time the variants with")
    feeds = golden_feeds(golden)
    manifest = verified.manifest
    variants = {v.id: v for v in manifest.variants if gate_passed(v)}

    def open_variant(variant_id: str) -> _Opened:
        meta = variants[variant_id]
        load = functools.partial(load_variant, meta.runtime)
        return _Opened(ServedVariant(meta, decrypt_and_load(verified, variant_id, agent.device_key, load)))

    disable_vendor_telemetry()  # before any runtime is imported, as the agent does
    # Every runtime the profile lists (the planner counts their footprints against the board's
    # budgets: converters/runtime_footprint.py), then any other the bundle's variants use. One
    # process: a library two runtimes share is counted for the first.
    listed = [r.runtime.value for r in agent.profile.runtimes]
    footprints = measure_runtime_imports(
        [*listed, *(str(getattr(v.runtime, "value", v.runtime)) for v in variants.values())]
    )
    measured, failed = measure_variants(list(variants.values()), open_variant, feeds, warmup=warmup, runs=runs)
    if not measured:
        raise AgentError("no variant could be timed here: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    ladder, not_steps = speed_ladder(measured)
    result = DeviceMeasurements(
        device_id=agent.config.device_id,
        profile=agent.profile.name,
        machine=platform.machine(),
        emulated=emulated,
        model=manifest.model.name,
        version=manifest.model.version,
        release=manifest.model.release,
        measured_at=datetime.now(timezone.utc),
        runtimes=footprints,
        variants=measured,
        speed_ladder=ladder,
        not_steps={**failed, **not_steps},
    )
    save(Path(agent.config.data_dir), result)
    return result


def save(data_dir: Path, measurements: DeviceMeasurements) -> Path:
    """Write the figures atomically (temp file, fsync, rename)."""
    path = data_dir / MEASUREMENTS_FILE
    partial = path.with_name(path.name + ".tmp")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(measurements.model_dump_json(indent=2))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    return path


def load_measurements(data_dir: Path) -> DeviceMeasurements | None:
    """The saved figures, or None when never measured (an unreadable file is logged and ignored)."""
    path = Path(data_dir) / MEASUREMENTS_FILE
    try:
        return DeviceMeasurements.parse_json_clear(path.read_bytes(), source=str(path))
    except FileNotFoundError:
        return None
    except (OSError, EdgeSDKError) as exc:
        log.warning("measurements %s ignored: %s", path, exc)
        return None


class SavedMeasurements:
    """``measurements.json``, read again only when the file changed: telemetry asks every tick,
    and the profiling child (or ``edge-agent profile``) rewrites it behind the daemon's back."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / MEASUREMENTS_FILE
        self._key: tuple[int, int] | None = None
        self._value: DeviceMeasurements | None = None

    def current(self) -> DeviceMeasurements | None:
        try:
            stat = self.path.stat()
        except OSError:
            self._key, self._value = None, None
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        if key != self._key:
            self._key, self._value = key, load_measurements(self.path.parent)
        return self._value


def load_saved(data_dir: Path) -> dict[str, Any] | None:
    """The saved figures as JSON for /v1/status, or None when never measured (or unreadable)."""
    path = Path(data_dir) / MEASUREMENTS_FILE
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("measurements %s unreadable: %s", path, exc)
        return None
