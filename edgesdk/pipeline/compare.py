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
}


def compare_results(kind: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far two task results of ``kind`` (a ``postprocess`` answer each) agree, 0..1."""
    if kind == "classes":
        return _top1_equal(a["labels"], b["labels"])
    if kind == "mask":
        return _pixel_agreement(np.asarray(a["mask"]), np.asarray(b["mask"]))
    raise UsageError(f"no task-level comparison for kind {kind!r}; known: {', '.join(FIGURES)}")


def _top1_equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    if not a or not b:
        return float(not a and not b)  # both empty (everything under the threshold) agree
    return float(a[0]["index"] == b[0]["index"])


def _pixel_agreement(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return 0.0
    return float((a == b).mean()) if a.size else 1.0
