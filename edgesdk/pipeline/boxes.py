"""A detector's output → boxes: decode, score threshold, class-aware non-maximum suppression.

numpy only. The output is (1, N, 4 + C) — or (1, N, 4 + 1 + C) with an objectness column, or
(1, 4 + C, N) when ``transposed`` (YOLOv8 exports) — in the model input's pixel coordinates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import BoxDecode, PostProcess

#: Candidates over the score threshold that suppression looks at, best first (Ultralytics'
#: ``max_nms``): each kept box costs a pass over the candidates left, so without a cap a
#: hostile image with 10^5 candidates and a high max_detections held a core for over a minute.
MAX_CANDIDATES = 10_000


def decode(output: np.ndarray, spec: BoxDecode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes xyxy (K, 4), scores (K,), classes (K,)) of the candidates at or above the threshold."""
    if output.ndim != 3 or output.shape[0] != 1:
        raise PipelineInputError(500, f"box decoding needs a (1, N, 4 + classes) output, got {output.shape}")
    rows = output[0].T if spec.transposed else output[0]
    first_class = 5 if spec.objectness else 4
    if rows.shape[1] <= first_class:
        raise PipelineInputError(
            500, f"box rows of {rows.shape[1]} values leave no class scores (need > {first_class})"
        )
    rows = rows.astype(np.float64)
    class_scores = rows[:, first_class:]
    if spec.objectness:
        class_scores = class_scores * rows[:, 4:5]
    classes = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(rows)), classes]
    keep = scores >= spec.score_threshold
    boxes = rows[keep, :4]
    if spec.format == "cxcywh":
        centre, size = boxes[:, :2], boxes[:, 2:4] / 2
        boxes = np.concatenate([centre - size, centre + size], axis=1)
    if not np.isfinite(boxes).all() or not np.isfinite(scores[keep]).all():
        raise PipelineInputError(500, "the model's boxes or scores hold NaN or Inf")
    return boxes, scores[keep], classes[keep]


def iou_one_to_many(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one xyxy box with each of ``others`` (0 where both are empty)."""
    top_left = np.maximum(box[:2], others[:, :2])
    bottom_right = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=1)
    area = np.prod(np.clip(box[2:] - box[:2], 0, None))
    areas = np.prod(np.clip(others[:, 2:] - others[:, :2], 0, None), axis=1)
    union = area + areas - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float, limit: int) -> list[int]:
    """Indices kept, best score first: a box is dropped when one kept before it, of the same
    class, overlaps it by more than ``iou_threshold``. Classes are separated by offsetting each
    class's boxes beyond every other's, so one pass serves all classes."""
    if not len(boxes):
        return []
    span = float(np.abs(boxes).max()) * 2 + 1
    shifted = boxes + (classes.astype(np.float64) * span)[:, None]
    order = np.argsort(-scores, kind="stable")[:MAX_CANDIDATES]
    kept: list[int] = []
    while order.size and len(kept) < limit:
        best, rest = order[0], order[1:]
        kept.append(int(best))
        order = rest[iou_one_to_many(shifted[best], shifted[rest]) <= iou_threshold]
    return kept


def detections(output: np.ndarray, post: PostProcess) -> list[dict[str, Any]]:
    """``[{"label", "index", "score", "box": [x1, y1, x2, y2]}, ...]``, best first."""
    spec = post.boxes
    boxes, scores, classes = decode(output, spec)
    labels = post.labels
    found = []
    for i in nms(boxes, scores, classes, spec.iou_threshold, spec.max_detections):
        index = int(classes[i])
        label = labels[index] if labels is not None and index < len(labels) else str(index)
        found.append({"label": label, "index": index, "score": float(scores[i]), "box": boxes[i].tolist()})
    return found
