"""A metric per output, by what the output is: every output of a variant is checked on its own.

One metric for every output hides what a user sees: argmax over landmark coordinates, or a
cosine of 0.9986 for landmarks 47 px off on a 64 px input, or a cosine of 0.9915 over logits
whose decoded text differs on 12.5 % of lines. So each output gets the figure its user reads:

* ``top1``: a classifier's top-1 agreement with the reference (per sample, 0/1);
* ``cosine``: an embedding's cosine (per sample);
* ``abs``: a regressor's (landmarks, boxes, a score) largest error per sample, in the output's
  own units, against a tolerance (``abs:1.5``: every coordinate within 1.5 units);
* ``iou``: a mask's intersection over union per sample (one channel: thresholded at 0.5, or at 0
  for logits; several channels: the argmax class map, mean IoU over the classes present);
* ``ctc``: a sequence recognizer's text: greedy CTC decode (argmax per step, repeats merged,
  blank dropped; blank index 0 unless told) or a user's ``decode`` hook, equal or not per sample;
* ``max_abs``: the largest difference over every sample (no tail, no bound: a worst case).

``--metric OUTPUT=KIND[:THRESHOLD][:blank=N]`` names one output; a bare ``KIND`` applies to every
output not named. THRESHOLD is a tolerance (≤) for ``abs``/``max_abs`` and a minimum (≥) for the
others. How a gate is read on these per-sample figures is read_output (tail_statistics.py).

Shared core (numpy only): the converters judge each variant with it on the host, and the device
agent's install check (agent/ota/smoke.py) judges the golden outputs with the same choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from edgesdk.errors import UsageError
from edgesdk.quality.tail_statistics import (
    OutputReading,
    agreement_reading,
    tail_reading,
    worst_case_reading,
)

Kind = Literal["top1", "cosine", "abs", "iou", "ctc", "max_abs"]
KINDS: tuple[Kind, ...] = ("top1", "cosine", "abs", "iou", "ctc", "max_abs")
#: Kinds whose per-sample figure is 0/1 (the gate reads a Wilson bound of the agreement).
AGREEMENT_KINDS = ("top1", "ctc")
#: Kinds whose threshold is an upper limit (an error), not a minimum.
ERROR_KINDS = ("abs", "max_abs")
DEFAULT_THRESHOLDS: dict[str, float] = {"top1": 0.99, "cosine": 0.99, "ctc": 0.99, "iou": 0.9, "max_abs": 1e-3}
#: Without a tolerance, ``abs`` allows this share of the output's range over the validation set.
DEFAULT_ABS_SHARE = 0.01

EMBEDDING_HINTS = ("emb", "feature", "hidden", "pool", "vector", "encod")
REGRESSION_HINTS = ("landmark", "keypoint", "coord", "point", "box", "regress", "pose", "depth")
MASK_HINTS = ("mask", "seg", "matte")
SEQUENCE_HINTS = ("ctc",)
CLASSIFIER_HINTS = ("logit", "prob", "class", "cls", "score", "softmax", "pred", "label")


@dataclass(frozen=True)
class OutputMetric:
    """How one output is judged. ``threshold`` None: the kind's default (resolve fills it)."""

    kind: Kind
    threshold: float | None = None
    blank: int = 0
    #: ``ctc`` only: one sample's output → its decoded value (compared with ==), instead of greedy CTC.
    decode: Callable[[np.ndarray], object] | None = None
    why: str = ""

    def describe(self) -> str:
        if self.kind in ERROR_KINDS:
            limit = f"≤ {self.threshold:.4g}" + (" (output units)" if self.kind == "abs" else "")
        else:
            limit = f"≥ {self.threshold:g}"
        extra = f", blank {self.blank}" if self.kind == "ctc" and self.decode is None else ""
        hook = " (user decode hook)" if self.decode is not None else ""
        return f"{self.kind} {limit}{extra}{hook}"


def parse_metric(text: str) -> tuple[str | None, OutputMetric]:
    """``OUTPUT=KIND[:THRESHOLD][:blank=N]`` or a bare ``KIND[...]`` (output None: every output)."""
    output, spec = _split_output(text)
    if output == "":
        raise UsageError(f"--metric {text!r}: no output name before '='; expected OUTPUT=KIND[:THRESHOLD]")
    kind, *options = spec.split(":")
    if kind not in KINDS:
        raise UsageError(f"--metric {text!r}: unknown kind {kind!r}; known: {', '.join(KINDS)} (or auto)")
    threshold: float | None = None
    blank = 0
    for option in options:
        if option.startswith("blank="):
            value = option.removeprefix("blank=")
            if not value.isdigit() or kind != "ctc":
                raise UsageError(f"--metric {text!r}: blank=N takes a class index and applies to ctc only")
            blank = int(value)
            continue
        try:
            threshold = float(option)
        except ValueError:
            raise UsageError(
                f"--metric {text!r}: {option!r} is not a number; expected OUTPUT=KIND[:THRESHOLD], e.g. "
                "landmarks=abs:1.5"
            ) from None
    return output, OutputMetric(kind, threshold, blank)  # type: ignore[arg-type]


def _split_output(text: str) -> tuple[str | None, str]:
    """OUTPUT ends at the rightmost '=' followed by a known kind: output names may hold ':' and '='
    (tf2onnx names outputs "StatefulPartitionedCall:0"), the kinds are a closed set."""
    for at in reversed([i for i, char in enumerate(text) if char == "="]):
        if text[at + 1 :].split(":")[0] in KINDS:
            return text[:at], text[at + 1 :]
    named, sep, spec = text.partition("=")
    if not sep or text.split(":")[0] in KINDS:  # "ctc:blank=3" names no output
        return None, text
    return named, spec


def requested_metrics(metric: str | Mapping[str, str | OutputMetric] | Iterable[str]) -> dict[str | None, OutputMetric]:
    """What the user asked for, by output (None: every output not named); "auto" asks nothing."""
    if isinstance(metric, str):
        items: list[tuple[str | None, str | OutputMetric]] = [] if metric == "auto" else [(None, metric)]
        if metric != "auto" and "=" in metric:
            items = [parse_metric(metric)]  # type: ignore[list-item]
    elif isinstance(metric, Mapping):
        items = list(metric.items())
    else:
        items = [parse_metric(m) for m in metric if m != "auto"]  # type: ignore[misc]
    asked: dict[str | None, OutputMetric] = {}
    for output, spec in items:
        if isinstance(spec, str):
            named, parsed = parse_metric(spec)
            spec = parsed
            output = output if named is None else named
        asked[output] = spec
    return asked


def choose(name: str, reference: np.ndarray, alone: bool = True) -> OutputMetric:
    """The metric for an output nobody named, from its name, shape ([samples, ...]) and values.

    ``alone``: the model's only output. A ``[samples, n]`` float is read as class scores when it
    is a softmax, named like scores, or alone; beside other outputs without such a name it is
    read as a regression (MediaPipe's landmarks are ``Identity [1, 63]`` beside three others)."""
    lowered = name.lower()
    shape = reference.shape[1:]
    floating = reference.dtype.kind == "f"
    if any(h in lowered for h in EMBEDDING_HINTS):
        return OutputMetric("cosine", why=f"named like an embedding ({name!r})")
    if any(h in lowered for h in MASK_HINTS):
        return OutputMetric("iou", why=f"named like a mask ({name!r})")
    if any(h in lowered for h in REGRESSION_HINTS):
        return OutputMetric("abs", why=f"named like coordinates or a regression ({name!r})")
    if any(h in lowered for h in SEQUENCE_HINTS) or (
        floating and len(shape) == 2 and _rows_are_distributions(reference)
    ):
        return OutputMetric("ctc", why=f"a sequence of class distributions {list(shape)}: decoded text compared")
    if int(np.prod(shape)) <= 1:
        return OutputMetric("abs", why="one value per sample: a regression or score, judged in its own units")
    if len(shape) == 1 and floating:
        if _rows_are_distributions(reference) or any(h in lowered for h in CLASSIFIER_HINTS) or alone:
            return OutputMetric("top1", why=f"[samples, {shape[0]}] float: read as class scores (a regressor: say abs)")
        return OutputMetric(
            "abs", why=f"[samples, {shape[0]}] float beside other outputs, not named like scores: read as "
            "coordinates or a regression (a classifier: say top1)"
        )  # fmt: skip
    if len(shape) == 3 and floating and 1 in (shape[0], shape[-1]) and _within_unit(reference):
        return OutputMetric("iou", why=f"a one-channel map of probabilities {list(shape)}: a mask")
    return OutputMetric("cosine", why=f"shape {list(shape)}: compared as a whole (cosine)")


def _rows_are_distributions(reference: np.ndarray) -> bool:
    """Every step of every sample is a softmax: non-negative, summing to 1 over the last axis (≥ 3 classes)."""
    if reference.shape[-1] < 3 or reference.size == 0:
        return False
    sums = reference.astype(np.float64).sum(-1)
    return bool(reference.min() >= 0 and np.allclose(sums, 1.0, atol=1e-3))


def _within_unit(reference: np.ndarray) -> bool:
    return bool(reference.size and reference.min() >= 0 and reference.max() <= 1)


def resolve(
    reference: Mapping[str, np.ndarray], asked: Mapping[str | None, OutputMetric], gate: float | None = None
) -> dict[str, OutputMetric]:
    """A concrete metric (kind, threshold, why) for every output of ``reference``.

    ``gate`` (``--gate``) is the minimum of every kind but abs, whose tolerance is in the output's
    units; abs without a tolerance allows 1 % of the output's range over the validation set."""
    unknown = sorted(n for n in asked if n is not None and n not in reference)
    if unknown:
        raise UsageError(
            f"--metric names output(s) {unknown} the model does not have; its outputs: {sorted(reference)}"
        )
    chosen = {}
    for name, ref in reference.items():
        metric = asked.get(name) or asked.get(None)
        if metric is None:
            metric = choose(name, np.asarray(ref), alone=len(reference) == 1)
        elif not metric.why:
            metric = replace(metric, why="named with --metric" if name in asked else "--metric for every output")
        if metric.threshold is None:
            metric = replace(metric, threshold=_default_threshold(metric.kind, np.asarray(ref), gate))
            if metric.kind == "abs":
                metric = replace(metric, why=f"{metric.why}; tolerance {DEFAULT_ABS_SHARE:.0%} of the output's range")
        chosen[name] = metric
    return chosen


def _default_threshold(kind: Kind, reference: np.ndarray, gate: float | None) -> float:
    if kind == "abs":
        # A probability's range is its unit interval, however narrow the validation set's spread.
        span = (
            1.0 if _within_unit(reference) else float(np.ptp(reference.astype(np.float64))) if reference.size else 0.0
        )
        return max(DEFAULT_ABS_SHARE * span, 1e-6)
    return gate if gate is not None else DEFAULT_THRESHOLDS[kind]


def per_sample(metric: OutputMetric, out: np.ndarray, want: np.ndarray) -> np.ndarray:
    """One figure per sample (axis 0) of two arrays of one output."""
    count = want.shape[0]
    out64 = np.asarray(out, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    if metric.kind == "ctc":
        decode = metric.decode or (lambda logits: greedy_ctc(logits, metric.blank))
        return np.array([float(_same(decode(o), decode(w))) for o, w in zip(out, want, strict=True)])
    if metric.kind == "iou":
        return mask_iou(out64, want64)
    flat_out, flat_want = out64.reshape(count, -1), want64.reshape(count, -1)
    if metric.kind == "top1":
        return (flat_out.argmax(1) == flat_want.argmax(1)).astype(np.float64)
    if metric.kind in ERROR_KINDS:
        return np.abs(flat_out - flat_want).max(1) if flat_want.shape[1] else np.zeros(count)
    dot = (flat_out * flat_want).sum(1)
    norms = np.linalg.norm(flat_out, axis=1) * np.linalg.norm(flat_want, axis=1)
    return np.where(norms > 0, dot / np.maximum(norms, 1e-30), 1.0)


def _same(a: object, b: object) -> bool:
    result = a == b
    return bool(np.all(result)) if isinstance(result, np.ndarray) else bool(result)


def greedy_ctc(logits: np.ndarray, blank: int = 0) -> tuple[int, ...]:
    """Best class per step ([steps, classes]), repeats merged, the blank class dropped."""
    best = np.asarray(logits).reshape(-1, np.asarray(logits).shape[-1]).argmax(-1)
    merged = best[np.concatenate(([True], best[1:] != best[:-1]))]
    return tuple(int(c) for c in merged if c != blank)


def mask_iou(out: np.ndarray, want: np.ndarray) -> np.ndarray:
    """IoU per sample: one channel thresholded (0.5 for probabilities, 0 for logits); several
    channels (axis 1 when it is the shorter of axis 1 and the last, else the last) → argmax map,
    mean IoU over the classes present in either map. Both empty: 1."""
    shape = want.shape[1:]
    channels_first = len(shape) == 3 and shape[0] <= shape[-1]
    channels = shape[0] if channels_first else (shape[-1] if len(shape) == 3 else 1)
    if channels <= 1:
        cut = 0.5 if _within_unit(want) else 0.0
        return _binary_iou(out.reshape(len(want), -1) > cut, want.reshape(len(want), -1) > cut)
    axis = 1 if channels_first else -1
    got, ref = out.argmax(axis).reshape(len(want), -1), want.argmax(axis).reshape(len(want), -1)
    scores = []
    for g, r in zip(got, ref, strict=True):
        classes = np.union1d(np.unique(g), np.unique(r))
        scores.append(float(np.mean([_binary_iou(g[None] == c, r[None] == c)[0] for c in classes])))
    return np.array(scores)


def _binary_iou(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    union = np.logical_or(got, ref).sum(1)
    inter = np.logical_and(got, ref).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def read_output(metric: OutputMetric, values: np.ndarray) -> OutputReading:
    """The gate of one output on its per-sample figures: agreement (Wilson), worst case, or tail."""
    threshold = float(metric.threshold if metric.threshold is not None else DEFAULT_THRESHOLDS[metric.kind])
    if metric.kind in AGREEMENT_KINDS:
        return agreement_reading(values, threshold)
    if metric.kind == "max_abs":
        return worst_case_reading(values, threshold)
    return tail_reading(values, threshold, lower_is_better=metric.kind in ERROR_KINDS)


def sentence(name: str, metric: OutputMetric, reading: OutputReading) -> str:
    """'landmarks: abs 47.2 (95th percentile, 95% upper bound 48.1; mean 12.3) on 64 samples vs ≤ 1.5: fail'."""
    if reading.statistic == "agreement":
        figure = f"{reading.value:.2%} agree (95% lower bound {reading.lower_bound:.2%})"
    else:
        side = "upper" if metric.kind in ERROR_KINDS else "lower"
        bound = "" if reading.lower_bound is None else f", 95% {side} bound {reading.lower_bound:.6g}"
        figure = f"{reading.value:.6g} ({reading.statistic}{bound}; mean {reading.mean:.6g})"
    text = f"{name}: {metric.kind} {figure} on {reading.samples} samples vs {metric.describe()}: {reading.verdict}"
    if reading.verdict == "inconclusive" and reading.samples_needed:
        # What the user can do about an inconclusive verdict: give this many validation samples.
        text += f"; about {reading.samples_needed} samples would tell at this agreement"
    return text
