"""Task-level agreement of two results of one input (a variant's against the reference's):
the figure a conversion gates on next to its tensor metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
