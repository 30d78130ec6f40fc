"""Validation of a variant in the runtime the device will use, against the reference outputs.

The variant is loaded from bytes through ``edgesdk.runtimes.load_variant``: exactly the
code path of the agent. Measured here: the accuracy metric and per-output max abs diff, load
time, batch-1 latency (median, p95) and the peak RSS growth of load + one batch-1 inference.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from edgesdk.converters.data import subset
from edgesdk.converters.input_spec import InputLayout
from edgesdk.converters.stateful import drift, run_all

from edgesdk.errors import ConversionError
from edgesdk.quality.output_metrics import OutputMetric, read_output, requested_metrics, resolve, sentence
from edgesdk.quality.output_metrics import per_sample as output_per_sample
from edgesdk.schemas.manifest import AccuracyResult, TensorSpec
from edgesdk.schemas.report import OutputAccuracy, VariantMeasurements

Metric = Literal["top1", "cosine", "max_abs"]
DEFAULT_GATES: dict[str, float] = {"top1": 0.99, "cosine": 0.99, "max_abs": 1e-3}


EMBEDDING_NAMES = ("emb", "feature", "hidden", "pool", "vector", "encod")

#: Host timings run every runtime on one thread, one stream: on a shared host a runtime that
#: spreads over all cores is timed on whatever the other jobs leave, so its ratios are noise;
#: one thread each is the same budget for every variant, fp32 and int8 alike.
HOST_TIMING_THREADS = 1


def host_options(runtime: str, options: Mapping[str, str] | None) -> dict[str, str]:
    """``options`` plus the single-thread settings of ``runtime`` (explicit options win)."""
    threads = str(HOST_TIMING_THREADS)
    fair = {
        "onnxruntime": {"intra_op_num_threads": threads},
        # LATENCY + one stream: one infer request gets the threads (THROUGHPUT would split them).
        "openvino": {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY"},
        "litert": {"num_threads": threads},
    }.get(runtime, {})
    return {**fair, **(options or {})}


def choose_metric(outputs: list[TensorSpec]) -> Metric:
    """top-1 agreement for classifiers ([batch, classes] float logits), cosine for anything else.

    A [batch, n] output named like an embedding ("embedding", "features", "pooled", ...) is not a
    classifier: its argmax means nothing, so it gets cosine too.
    """
    first = outputs[0]
    classes = first.shape[-1] if first.shape else None
    if any(hint in first.name.lower() for hint in EMBEDDING_NAMES):
        return "cosine"
    if first.dtype.startswith("float") and len(first.shape) == 2 and isinstance(classes, int) and classes > 1:
        return "top1"
    return "cosine"


def score(metric: Metric, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """The metric over all samples (top1/cosine: on every output, the worst; max_abs: the largest)."""
    values = []
    for name, ref in reference.items():
        out = np.asarray(outputs[name], dtype=np.float64).reshape(ref.shape[0], -1)
        want = np.asarray(ref, dtype=np.float64).reshape(ref.shape[0], -1)
        if metric in ("top1", "cosine"):
            values.append(float(per_sample(metric, out, want).mean()))
            if metric == "top1":
                break  # the first output is the prediction
        else:
            values.append(float(np.abs(out - want).max()))
    return max(values) if metric == "max_abs" else min(values)


def per_sample(metric: Metric, out: np.ndarray, want: np.ndarray) -> np.ndarray:
    """top1 or cosine per sample of two [samples, values] arrays: 1.0/0.0 top-1 agreement, or
    the cosine (1.0 where a sample's outputs are all zero)."""
    if metric == "top1":
        return (out.argmax(1) == want.argmax(1)).astype(np.float64)
    dot = (out * want).sum(1)
    norms = np.linalg.norm(out, axis=1) * np.linalg.norm(want, axis=1)
    return np.where(norms > 0, dot / np.maximum(norms, 1e-30), 1.0)


def passes(metric: Metric, value: float, gate: float) -> bool:
    return value <= gate if metric == "max_abs" else value >= gate


def judge_outputs(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], metrics: Mapping[str, OutputMetric]
) -> list[tuple[OutputAccuracy, int | None]]:
    """Every output against its own metric (with the samples an agreement would need to pass)."""
    judged = []
    for name, metric in metrics.items():
        reading = read_output(metric, output_per_sample(metric, outputs[name], reference[name]))
        judged.append(
            (
                OutputAccuracy(
                    output=name,
                    metric=metric.kind,
                    value=round(reading.value, 6),
                    statistic=reading.statistic,
                    mean=round(reading.mean, 6),
                    bound=None if reading.lower_bound is None else round(reading.lower_bound, 6),
                    threshold=float(metric.threshold or 0.0),
                    passed=reading.verdict != "fail",
                    verdict=reading.verdict,
                    samples=reading.samples,
                    why=metric.why,
                    note=sentence(name, metric, reading),
                ),
                reading.samples_needed,
            )
        )
    return judged


def summary(
    metric: Metric,
    gate: float,
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    per_output: list[tuple[OutputAccuracy, int | None]],
    max_abs: dict[str, float],
) -> AccuracyResult:
    """The manifest's one accuracy line: passed when every output passes, the worst verdict, and
    the figure of the deciding output (the first that fails, else is inconclusive, else the first)
    where the manifest's metrics can say it (top1, cosine); else the golden check's ``metric``."""
    order = {"fail": 0, "inconclusive": 1, "pass": 2}
    deciding, needed = min(per_output, key=lambda item: order[item[0].verdict])
    label: Metric = metric
    if deciding.metric == "top1" or deciding.metric == "cosine":
        label, value, lower, threshold = deciding.metric, deciding.value, deciding.bound, deciding.threshold
    else:
        value, lower, threshold, needed = score(metric, outputs, reference), None, gate, None
    return AccuracyResult(
        metric=label,
        value=value,
        gate=threshold,
        passed=all(o.passed for o, _ in per_output),
        samples=int(next(iter(reference.values())).shape[0]),
        max_abs_diff=max_abs,
        lower_bound=lower,
        verdict=deciding.verdict,
        samples_needed=needed,
        note="; ".join(o.note for o, _ in per_output),
    )


class _PeakRss:
    """Samples this process's RSS in a thread: the peak while a variant loads and runs."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20


def _quantize(value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    if spec.quantization is None or value.dtype.name == spec.dtype:
        return value.astype(spec.dtype, copy=False)
    info = np.iinfo(np.dtype(spec.dtype))
    scale, zero = spec.quantization.scale[0], spec.quantization.zero_point[0]
    return np.clip(np.round(value / scale) + zero, info.min, info.max).astype(spec.dtype)


def _dequantize(value: np.ndarray, spec: TensorSpec | None) -> np.ndarray:
    if spec is None or spec.quantization is None:
        return value
    return (value.astype(np.float32) - spec.quantization.zero_point[0]) * np.float32(spec.quantization.scale[0])


@dataclass
class ValidationResult:
    accuracy: AccuracyResult | None
    measurements: VariantMeasurements
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    validation: Literal["numeric", "unvalidated", "spec-only"] = "numeric"
    latencies_ms: list[float] = field(default_factory=list)
    #: A stateful model's max |difference| per step of its streams (state fed back), else empty.
    stream_drift: list[float] = field(default_factory=list)
    #: Every output against its own metric (output_metrics.py); the variant passes when all do.
    output_accuracy: list[OutputAccuracy] = field(default_factory=list)


def validate_numeric(
    runtime: str,
    files: Mapping[str, Path],
    data: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    *,
    metric: Metric,
    gate: float,
    options: Mapping[str, str] | None = None,
    latency_runs: int = 30,
    layout: InputLayout | None = None,
    metrics: Mapping[str, OutputMetric] | None = None,
) -> ValidationResult:
    """Load the variant from bytes in ``runtime`` and compare it with the reference.

    ``data`` and ``reference`` are sample-major; ``layout`` says how the model takes them.
    ``metrics`` judges each output (output_metrics.resolve); without it ``metric``/``gate`` apply
    to every output. ``metric`` also labels the summary (the bundle's golden check metric)."""
    layout = layout or InputLayout()
    blobs = {name: path.read_bytes() for name, path in files.items()}
    model, one, load_ms, peak_growth_mb = _load_at_batch1(runtime, blobs, options, layout, data)
    fp16_compute = _judged_as_device_computes(runtime, blobs, options)
    judged = fp16_compute or model
    names = list(reference)
    run = _ByReferenceNames(runtime, model, judged, names)
    outputs = run_all(run, layout, data, layout.batch_size(model.inputs))
    stream_drift = drift(outputs, reference) if layout.state_pairs and layout.steps(data) else []
    per_output = judge_outputs(outputs, reference, metrics or resolve(reference, requested_metrics(metric), gate))
    max_abs = {n: float(np.abs(outputs[n].astype(np.float64) - reference[n].astype(np.float64)).max()) for n in names}
    latencies = _batch1_latencies_ms(model, one, latency_runs)
    inputs, outputs_spec = list(model.inputs), list(model.outputs)
    model.close()
    judged.close()
    how = "; accuracy judged at f16 compute (converters/fp16_compute.py)" if fp16_compute else ""
    return ValidationResult(
        accuracy=summary(metric, gate, outputs, reference, per_output, max_abs),
        output_accuracy=[o for o, _ in per_output],
        measurements=VariantMeasurements(
            load_ms=round(load_ms, 3),
            latency_p50_ms=round(float(np.median(latencies)), 4),
            latency_p95_ms=round(float(np.percentile(latencies, 95)), 4),
            peak_rss_mb=round(peak_growth_mb, 2),
            note=f"batch 1, {HOST_TIMING_THREADS} thread, on this host ({runtime}); peak RSS is growth during load + one batch-1 inference{how}",
        ),
        inputs=inputs,
        outputs=[run.out_specs[run.mapping[n]].model_copy(update={"name": n}) for n in names] if outputs_spec else [],
        latencies_ms=latencies,
        stream_drift=stream_drift,
    )


def _load_at_batch1(
    runtime: str,
    blobs: Mapping[str, bytes],
    options: Mapping[str, str] | None,
    layout: InputLayout,
    data: Mapping[str, np.ndarray],
) -> tuple[Any, dict[str, np.ndarray], float, float]:
    """The variant loaded and run once at batch 1: the model, that batch-1 feed, the load time
    (ms) and the peak RSS growth (MB) while it loaded and ran."""
    from edgesdk.runtimes import load_variant

    # Memory is judged as a device serves: load plus one inference at batch 1. The batched pass
    # after this is for accuracy only; inside this window its activations would make the figure
    # grow with the number of validation samples (issue 38: 947 MB at batch 24, 49 MB at batch 1).
    with _PeakRss() as rss:
        started = time.perf_counter()
        model = load_variant(runtime, blobs, options=host_options(runtime, options))
        load_ms = (time.perf_counter() - started) * 1000
        in_specs = {s.name: s for s in model.inputs}
        one = {k: _quantize(v, in_specs[k]) for k, v in layout.feed(subset(data, 1)).items()}
        model.run(one)
    return model, one, load_ms, rss.growth_mb


class _ByReferenceNames:
    """Runs a loaded variant float in, float out, by the reference's names: a fed-back state is
    re-quantized, and outputs a runtime renamed are found by position."""

    def __init__(self, runtime: str, model: Any, judged: Any, names: list[str]) -> None:
        self._runtime = runtime
        self._judged = judged
        self._names = names
        self._in_specs = {s.name: s for s in model.inputs}
        self.out_specs = {s.name: s for s in model.outputs}
        #: reference name -> the runtime's output name, learnt on the first batch.
        self.mapping: dict[str, str] = {}
        self._sequence_axes: dict[str, int] = getattr(model, "sequence_axes", None) or {}

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from edgesdk.runtimes.sequence_buckets import trim

        feeds = {}
        for name, value in batch.items():
            if name not in self._in_specs:
                raise ConversionError(
                    f"{self._runtime} variant has inputs {sorted(self._in_specs)}; the model's input {name!r} is missing"
                )
            feeds[name] = _quantize(value, self._in_specs[name])
        if self._sequence_axes:
            # A bucketed model (sequence_buckets.py) is fed as a device is: each sample cut to
            # its used length, which the runtime pads to the shortest bucket that holds it.
            feeds = trim(feeds, self._sequence_axes)
        raw = self._judged.run(feeds)
        if not self.mapping:
            # Runtimes may rename outputs (e.g. an OpenVINO port without names): fall back to position.
            produced = list(raw)
            self.mapping.update({n: (n if n in raw else produced[i]) for i, n in enumerate(self._names)})
        return {n: _dequantize(raw[self.mapping[n]], self.out_specs.get(self.mapping[n])) for n in self._names}


def _batch1_latencies_ms(model: Any, one: Mapping[str, np.ndarray], runs: int) -> list[float]:
    """``runs`` timed batch-1 inferences, after a warm-up (first calls allocate and pick kernels)."""
    for _ in range(3):
        model.run(one)
    latencies = []
    for _ in range(runs):
        started = time.perf_counter()
        model.run(one)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _judged_as_device_computes(runtime: str, blobs: Mapping[str, bytes], options: Mapping[str, str] | None) -> Any:
    """The fp16 part: an fp16 IR loaded to compute as an fp16 device does (converters/fp16_compute.py),
    for its accuracy only; None for every other variant (judged as loaded)."""
    from edgesdk.converters.fp16_compute import fp16_judged, is_fp16_ir

    from edgesdk.runtimes import load_variant

    if not is_fp16_ir(runtime, blobs, options):
        return None
    files, judged_options = fp16_judged(blobs, options)
    return load_variant(runtime, files, options=host_options(runtime, judged_options))


def latency_side_by_side(
    variants: Mapping[str, tuple[str, Mapping[str, Path], Mapping[str, str] | None]],
    sample: Mapping[str, np.ndarray],
    rounds: int = 40,
    layout: InputLayout | None = None,
) -> dict[str, tuple[float, float]]:
    """Batch-1 (median, p95) ms per variant, measured round-robin so that load from other
    processes falls on every variant alike: variant id → (runtime, files, options)."""
    from edgesdk.runtimes import load_variant

    models, feeds = {}, {}
    for variant_id, (runtime, files, options) in variants.items():
        model = load_variant(
            runtime, {n: p.read_bytes() for n, p in files.items()}, options=host_options(runtime, options)
        )
        specs = {s.name: s for s in model.inputs}
        one = (layout or InputLayout()).feed(subset(sample, 1))
        feeds[variant_id] = {k: _quantize(v, specs[k]) for k, v in one.items()}
        for _ in range(3):
            model.run(feeds[variant_id])
        models[variant_id] = model
    timings: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(rounds):
        for variant_id, model in models.items():
            started = time.perf_counter()
            model.run(feeds[variant_id])
            timings[variant_id].append((time.perf_counter() - started) * 1000)
    for model in models.values():
        model.close()
    return {v: (round(float(np.median(t)), 4), round(float(np.percentile(t, 95)), 4)) for v, t in timings.items()}
