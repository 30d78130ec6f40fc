"""The smoke test: before a bundle may serve, every variant this device can run is loaded from
memory and must reproduce the golden outputs the publisher shipped in the bundle.

Plaintext never touches the disk: decrypt_variant/decrypt_golden return bytes and arrays, the
runtime loads from bytes, and everything is dropped when the test ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edgesdk.errors import EdgeSDKError, UpdateError
from edgesdk.quality.output_metrics import (
    ERROR_KINDS,
    OutputMetric,
    choose,
    per_sample,
    read_output,
    resolve,
    sentence,
)
from edgesdk.schemas.manifest import BundleManifest, Variant

log = logging.getLogger(__name__)


class SmokeTestError(UpdateError):
    """A variant failed to load, or did not reproduce the golden outputs."""


@dataclass
class SmokeReport:
    """What the smoke test found, per variant."""

    passed: dict[str, float] = field(default_factory=dict)  # variant id → its lowest agreement/similarity
    skipped: dict[str, str] = field(default_factory=dict)  # variant id → why


def split_golden(golden: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """golden.npz holds inputs under their names and expected outputs under ``output:<name>``."""
    inputs = {k: v for k, v in golden.items() if not k.startswith("output:")}
    expected = {k.removeprefix("output:"): v for k, v in golden.items() if k.startswith("output:")}
    return inputs, expected


def score(metric: str, got: np.ndarray, want: np.ndarray) -> float:
    """top1: share of rows with the same argmax; cosine: mean row cosine; max_abs: max |diff|."""
    got = np.asarray(got, dtype=np.float64).reshape(len(want), -1) if want.ndim > 0 else np.asarray(got, np.float64)
    want = np.asarray(want, dtype=np.float64).reshape(len(want), -1) if want.ndim > 0 else want
    if got.shape != want.shape:
        raise SmokeTestError(f"output shape {got.shape} != golden {want.shape}")
    if metric == "top1":
        return float(np.mean(np.argmax(got, axis=-1) == np.argmax(want, axis=-1)))
    if metric == "cosine":
        num = np.sum(got * want, axis=-1)
        norms = np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1)
        # Two all-zero rows agree (a detector saying "nothing" to silence), as the converter scores them.
        both_zero = (np.linalg.norm(got, axis=-1) == 0) & (np.linalg.norm(want, axis=-1) == 0)
        # No additive epsilon: a mask that is ~1e-7 everywhere has a norm product under 1e-12 and
        # would score 0 against itself (a selfie segmenter on an image without a person).
        return float(np.mean(np.where(both_zero, 1.0, num / np.maximum(norms, np.finfo(np.float64).tiny))))
    return float(np.max(np.abs(got - want))) if got.size else 0.0


def passes(metric: str, value: float, gate: float) -> bool:
    return value <= gate if metric == "max_abs" else value >= gate


#: How far past what the converter measured for a variant on the host (its ``max_abs_diff``
#: per output) the device may drift and still count as reproducing it: another CPU's kernels.
HOST_DRIFT_SLACK = 2.0


def device_metric(name: str, want: np.ndarray, alone: bool, manifest: BundleManifest) -> OutputMetric:
    """The output's metric, chosen on the device as the converter chose it (edgesdk.quality): the
    manifest names one golden metric for the whole model, and older agents refuse a manifest with
    a field they do not know (extra="forbid"), so per-output metrics are derived here from each
    golden output's name, shape and values. The golden metric's gate applies where it is that kind;
    a golden ``max_abs`` (only ever asked for by the publisher) still applies to every output."""
    if manifest.golden is not None and manifest.golden.metric == "max_abs":
        return OutputMetric("max_abs", manifest.golden.gate, why="the bundle's golden metric")
    chosen = choose(name, want, alone=alone)
    if manifest.golden is not None and manifest.golden.metric == chosen.kind:
        return replace(chosen, threshold=manifest.golden.gate)
    return resolve({name: want}, {None: chosen})[name]


def check_outputs(
    meta: Variant, outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray], manifest: BundleManifest
) -> float:
    """Every golden output against its own metric; raises naming the first output that fails.

    The golden set is a few samples, so a figure is read at its point (the converter read the
    bounds on the validation set): a failing output is refused unless it is no further from the
    reference than the converter measured for this variant on the host (its ``max_abs_diff``):
    the device must reproduce what the publisher shipped, not beat it."""
    worst = 1.0
    for name, want in expected.items():
        if name not in outputs:
            raise SmokeTestError(f"variant {meta.id} has no output {name!r} (golden has it)")
        want = want.reshape(1, -1) if want.ndim == 0 else want  # a scalar: one sample of one value
        got = np.asarray(outputs[name])
        if got.size != want.size:
            raise SmokeTestError(f"variant {meta.id} output {name!r}: shape {got.shape} != golden {want.shape}")
        got = got.reshape(want.shape)
        if got.dtype.kind == "f" and not np.isfinite(got).all() and np.isfinite(want).all():
            raise SmokeTestError(f"variant {meta.id} output {name!r} holds NaN or Inf where the golden outputs do not")
        metric = device_metric(name, want, len(expected) == 1, manifest)
        reading = read_output(metric, per_sample(metric, got, want))
        if reading.verdict == "fail" and not _as_on_the_host(meta, name, got, want):
            raise SmokeTestError(
                f"variant {meta.id} output {sentence(name, metric, reading)} against the golden outputs "
                "(the model does not reproduce what its publisher shipped)"
            )
        worst = min(worst, reading.value) if metric.kind not in ERROR_KINDS else worst
    return worst


def _as_on_the_host(meta: Variant, name: str, got: np.ndarray, want: np.ndarray) -> bool:
    measured = meta.accuracy.max_abs_diff.get(name) if meta.accuracy is not None else None
    if measured is None or got.size == 0:
        return False
    drift = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    return drift <= HOST_DRIFT_SLACK * measured


def run_variant(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Run the golden batch at once; models with a fixed batch of 1 get it row by row."""
    try:
        return run(inputs)
    except EdgeSDKError:
        counts = {v.shape[0] if v.ndim else 0 for v in inputs.values()}
        rows = min(counts) if len(counts) == 1 else 0  # a 0-d input or unequal axes 0: no rows to split
        if rows <= 1:
            raise
        parts = [run({k: v[i : i + 1] for k, v in inputs.items()}) for i in range(rows)]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def smoke_test(
    verified: Any,
    decrypt: Callable[[Any, str], dict[str, bytes]],
    golden: dict[str, np.ndarray] | None,
    *,
    runnable: Callable[[Variant], bool] | None = None,
) -> SmokeReport:
    """Load every eligible variant of ``verified`` from memory and compare with its golden set.

    ``decrypt(verified, variant_id)`` gives a variant's files and ``golden`` is the bundle's
    golden set, both from the :class:`~edgesdk.agent.ports.BundleOpener` that verified it (so
    the device key stays where that opener keeps it). Raises SmokeTestError naming the first
    variant that fails. Variants whose runtime is not installed here are skipped (and listed);
    at least one variant must pass."""
    from edgesdk.agent.serving import ServedVariant, gate_passed

    from edgesdk.runtimes import load_variant

    manifest: BundleManifest = verified.manifest
    inputs, expected = split_golden(golden) if golden else ({}, {})
    report = SmokeReport()
    for meta in manifest.variants:
        if not gate_passed(meta):
            report.skipped[meta.id] = "failed its accuracy gate when packaged (never served)"
            continue
        if runnable is not None and not runnable(meta):
            report.skipped[meta.id] = f"runtime {meta.runtime} not available on this device"
            continue
        try:
            files = decrypt(verified, meta.id)
            loaded = load_variant(meta.runtime, files)
            del files
        except EdgeSDKError as exc:
            raise SmokeTestError(f"variant {meta.id} does not load: {exc}") from exc
        try:
            variant = ServedVariant(meta, loaded)
            feeds = inputs or {
                s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], s.dtype) for s in variant.inputs
            }
            try:
                outputs = run_variant(variant.run, feeds)
            except EdgeSDKError as exc:
                raise SmokeTestError(f"variant {meta.id} fails on the golden inputs: {exc}") from exc
            if not expected:
                report.passed[meta.id] = 1.0
                continue
            report.passed[meta.id] = check_outputs(meta, outputs, expected, manifest)
        finally:
            loaded.close()
    if not report.passed:
        raise SmokeTestError(
            "no variant of the bundle can run on this device: "
            + "; ".join(f"{k}: {v}" for k, v in report.skipped.items())
        )
    log.info("smoke test passed: %s (skipped: %s)", report.passed, report.skipped or "none")
    return report
