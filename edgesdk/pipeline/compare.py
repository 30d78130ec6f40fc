"""Task-level agreement of two results of one input (a variant's against the reference's):
the figures a conversion gates on next to its tensor metrics. ``compare_results`` gives one
0..1 agreement; ``sample_figures`` gives the end-to-end gate's per-sample figures of a kind
(box recall, precision and matched IoU; mask IoU; exact text and character error rate;
embedding cosine), which ``read_figure`` reads on their tail: the gate reads the worst sample
(or a named percentile), the mean is reported beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edgesdk.errors import UsageError

#: Result kind → what its figure is (1.0 = the same task answer).
FIGURES = {
    "classes": "1.0 when the top-1 labels are equal, else 0.0",
    "mask": "fraction of pixels with the same class",
    "boxes": "summed IoU of same-class boxes matched one to one (greedy, best first), over the larger count",
    "ctc": "1.0 when the decoded texts are equal, else 0.0",
    "embedding": "cosine similarity",
}


def compare_results(kind: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far two task results of ``kind`` (a ``postprocess`` answer each) agree, 0..1."""
    if kind == "classes":
        return _top1_equal(a["labels"], b["labels"])
    if kind == "mask":
        return _pixel_agreement(np.asarray(a["mask"]), np.asarray(b["mask"]))
    if kind == "boxes":
        return _box_agreement(a["boxes"], b["boxes"])
    if kind == "ctc":
        return float(a["text"] == b["text"])
    if kind == "embedding":
        return _cosine(np.asarray(a["embedding"], np.float64), np.asarray(b["embedding"], np.float64))
    raise UsageError(f"no task-level comparison for kind {kind!r}; known: {', '.join(FIGURES)}")


def _top1_equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    if not a or not b:
        return float(not a and not b)  # both empty (everything under the threshold) agree
    return float(a[0]["index"] == b[0]["index"])


def _pixel_agreement(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return 0.0
    return float((a == b).mean()) if a.size else 1.0


def _box_agreement(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    from edgesdk.pipeline.boxes import iou_one_to_many

    if not a or not b:
        return float(not a and not b)
    free = list(range(len(b)))
    total = 0.0
    for box in a:
        same = [j for j in free if b[j]["index"] == box["index"]]
        if not same:
            continue
        ious = iou_one_to_many(np.asarray(box["box"], np.float64), np.asarray([b[j]["box"] for j in same], np.float64))
        best = int(ious.argmax())
        total += float(ious[best])
        free.remove(same[best])
    return total / max(len(a), len(b))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not a.size:
        return 0.0
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms > 0 else float(np.array_equal(a, b))


# -- the end-to-end gate's per-sample figures (issue 42): one figure per sample, read on its tail --


@dataclass(frozen=True)
class Gate:
    """One task-level gate: a per-sample figure read on its worst sample (or, named, a
    percentile of the tail), or for ``reads="share"`` the share of samples where it holds."""

    name: str
    threshold: float
    higher_is_better: bool = True
    percentile: float | None = None
    reads: Literal["tail", "share"] = "tail"


#: Boxes of one class match (greedy, best IoU first) at or above this IoU.
MATCH_IOU = 0.5
#: Each kind's gates and their defaults (``convert --task-gate NAME=VALUE[@pN]`` overrides one).
DEFAULT_GATES: dict[str, tuple[Gate, ...]] = {
    "boxes": (Gate("recall", 0.9), Gate("precision", 0.9), Gate("box_iou", 0.8)),
    "mask": (Gate("mask_iou", 0.9),),
    "ctc": (Gate("exact", 0.9, reads="share"), Gate("cer", 0.1, higher_is_better=False)),
    "embedding": (Gate("cosine", 0.99),),
}


@dataclass(frozen=True)
class BoxMatch:
    """One image's boxes against the reference's: recall, precision and the matched IoUs."""

    recall: float
    precision: float
    ious: tuple[float, ...]


def match_boxes(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], match_iou: float = MATCH_IOU) -> BoxMatch:
    """Greedy one-to-one matching per class, best IoU first, pairs below ``match_iou`` left out.
    ``theirs`` is the reference: recall counts its boxes found, precision ours that are right."""
    pairs = []
    for i, box in enumerate(ours):
        for j, other in enumerate(theirs):
            if box["index"] == other["index"]:
                pairs.append((_iou(box["box"], other["box"]), i, j))
    taken_ours, taken_theirs, ious = set(), set(), []
    for iou, i, j in sorted(pairs, key=lambda p: -p[0]):
        if iou >= match_iou and i not in taken_ours and j not in taken_theirs:
            taken_ours.add(i)
            taken_theirs.add(j)
            ious.append(iou)
    recall = len(ious) / len(theirs) if theirs else float(not ours)
    precision = len(ious) / len(ours) if ours else float(not theirs)
    return BoxMatch(recall, precision, tuple(ious))


def _iou(a: Any, b: Any) -> float:
    from edgesdk.pipeline.boxes import iou_one_to_many

    return float(iou_one_to_many(np.asarray(a, np.float64), np.asarray([b], np.float64))[0])


def mask_iou(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Mean over the classes either mask shows of that class's IoU (1.0 for two equal masks)."""
    if ours.shape != theirs.shape:
        return 0.0
    classes = np.union1d(np.unique(ours), np.unique(theirs))
    ious = [np.logical_and(ours == c, theirs == c).sum() / np.logical_or(ours == c, theirs == c).sum() for c in classes]
    return float(np.mean(ious)) if ious else 1.0


def char_error_rate(ours: str, theirs: str) -> float:
    """Levenshtein distance from ``theirs`` to ``ours`` over ``theirs``'s length (1.0 per extra
    character when ``theirs`` is empty)."""
    previous = list(range(len(ours) + 1))
    for row, expected in enumerate(theirs, start=1):
        current = [row]
        for column, got in enumerate(ours, start=1):
            current.append(min(previous[column] + 1, current[-1] + 1, previous[column - 1] + (got != expected)))
        previous = current
    return previous[-1] / max(len(theirs), 1)


def sample_figures(
    kind: str, ours: Mapping[str, Any], theirs: Mapping[str, Any], match_iou: float = MATCH_IOU
) -> dict[str, float | None]:
    """One sample's figure for each gate of ``kind`` (None: no figure here, e.g. no matched box)."""
    if kind == "boxes":
        match = match_boxes(ours["boxes"], theirs["boxes"], match_iou)
        return {"recall": match.recall, "precision": match.precision, "box_iou": min(match.ious, default=None)}
    if kind == "mask":
        return {"mask_iou": mask_iou(np.asarray(ours["mask"]), np.asarray(theirs["mask"]))}
    if kind == "ctc":
        return {"exact": float(ours["text"] == theirs["text"]), "cer": char_error_rate(ours["text"], theirs["text"])}
    if kind == "embedding":
        return {"cosine": compare_results(kind, ours, theirs)}
    raise UsageError(f"no per-sample task figures for kind {kind!r}; known: {', '.join(DEFAULT_GATES)}")


@dataclass(frozen=True)
class FigureReading:
    """A gate's reading: ``value`` is what it gates on (the tail, or the share), ``mean`` beside it."""

    gate: Gate
    value: float
    mean: float
    statistic: str
    samples: int
    worst: int | None  # index of the worst sample, None when there is none
    passed: bool


def read_figure(gate: Gate, values: list[float | None]) -> FigureReading:
    """``gate`` over the samples that have the figure: the worst one (or the named percentile,
    taken on the worse side), or the share of samples that hold it."""
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if not present:
        return FigureReading(gate, 1.0, 1.0, "no samples with this figure", 0, None, True)
    figures = np.asarray([v for _, v in present], np.float64)
    sign = 1.0 if gate.higher_is_better else -1.0
    worst = present[int(np.argmin(sign * figures))][0]
    if gate.reads == "share":
        value, statistic = float(figures.mean()), "share of samples"
    elif gate.percentile is None:
        value, statistic = float(values[worst]), "worst sample"  # type: ignore[arg-type]
    else:
        method: Literal["lower", "higher"] = "lower" if gate.higher_is_better else "higher"
        value, statistic = float(np.percentile(figures, gate.percentile, method=method)), f"p{gate.percentile:g}"
    passed = value >= gate.threshold if gate.higher_is_better else value <= gate.threshold
    return FigureReading(gate, value, float(figures.mean()), statistic, len(present), worst, bool(passed))
