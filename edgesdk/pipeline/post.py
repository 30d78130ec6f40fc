"""A model output → the task result: top-k labels with scores, an argmax mask (sent as PNG),
greedy-CTC text, or a pooled embedding. (Boxes: ``edgesdk/pipeline/boxes.py``.)"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import PostProcess


def activate(scores: np.ndarray, activation: str) -> np.ndarray:
    """Softmax or sigmoid over the last axis (or the scores as they are), in float64."""
    scores = scores.astype(np.float64)
    if activation == "softmax":
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-scores))
    return scores


def top_classes(output: np.ndarray, post: PostProcess) -> list[dict[str, Any]]:
    """The ``top_k`` best classes of a batch-of-one output, at or above ``threshold``, best first."""
    scores = activate(output.reshape(-1), post.activation)
    if not np.isfinite(scores).all():
        raise PipelineInputError(500, "the model's output has NaN or Inf; no classes can be ranked")
    k = min(post.top_k, scores.size)
    best = np.argsort(-scores, kind="stable")[:k]
    labels = post.labels
    result = []
    for index in best.tolist():
        score = float(scores[index])
        if post.threshold is not None and score < post.threshold:
            break
        label = labels[index] if labels is not None and index < len(labels) else str(index)
        result.append({"label": label, "index": index, "score": score})
    return result


#: A one-channel mask's probability at which a pixel is the class (when no ``threshold`` is set).
BINARY_MASK_THRESHOLD = 0.5


def argmax_mask(output: np.ndarray, post: PostProcess) -> np.ndarray:
    """Argmax over the class axis of a (1, C, H, W) or (1, H, W, C) output: (H, W) uint8 class
    indices. A one-channel output (a sigmoid map: a person, text regions) has two classes: 1
    where it is at or above ``threshold`` (default 0.5), else 0; an argmax over one channel
    would answer 0 everywhere."""
    if output.ndim != 4 or output.shape[0] != 1:
        raise PipelineInputError(500, f"a mask needs a (1, C, H, W) or (1, H, W, C) output, got {output.shape}")
    axis = 1 if post.mask_layout == "NCHW" else 3
    if output.shape[axis] > 256:
        raise PipelineInputError(500, f"a mask PNG holds at most 256 classes, the output has {output.shape[axis]}")
    if output.shape[axis] == 1:
        cut = BINARY_MASK_THRESHOLD if post.threshold is None else post.threshold
        return (np.take(output, 0, axis=axis)[0] >= cut).astype(np.uint8)
    return np.argmax(output, axis=axis)[0].astype(np.uint8)


def png_of(mask: np.ndarray) -> bytes:
    """An 8-bit greyscale PNG of a (H, W) uint8 class mask (how /predict answers a mask)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(mask).save(buffer, format="PNG")
    return buffer.getvalue()


def mask_png(output: np.ndarray, post: PostProcess) -> bytes:
    """Argmax over the class axis of a mask output → an 8-bit PNG of class indices."""
    return png_of(argmax_mask(output, post))


def ctc_greedy(output: np.ndarray, post: PostProcess) -> str:
    """Greedy CTC of a (1, T, C) output (or (T, C)): best class per step, repeats collapsed,
    blanks dropped, tokens joined."""
    vocabulary = post.vocabulary or []
    if output.ndim == 3 and output.shape[0] == 1:
        steps = output[0]
    elif output.ndim == 2:
        steps = output
    else:
        raise PipelineInputError(500, f"greedy CTC needs a (1, T, C) output, got {output.shape}")
    if steps.shape[1] != len(vocabulary):
        raise PipelineInputError(
            500, f"the output has {steps.shape[1]} classes per step; the vocabulary has {len(vocabulary)} tokens"
        )
    best = steps.argmax(axis=1)
    changed = np.concatenate([[True], best[1:] != best[:-1]])
    return "".join(vocabulary[i] for i in best[changed].tolist() if i != post.blank)


def embedding(output: np.ndarray, post: PostProcess, attention_mask: np.ndarray | None) -> list[float]:
    """A (1, D) output, or a (1, T, D) one pooled over its tokens (mean over the attention
    mask, or the first token), L2-normalised if asked."""
    vectors = output.astype(np.float64)
    if post.pool == "none" and vectors.ndim == 2 and vectors.shape[0] == 1:
        pooled = vectors[0]
    elif post.pool != "none" and vectors.ndim == 3 and vectors.shape[0] == 1:
        if post.pool == "cls":
            pooled = vectors[0, 0]
        else:
            weights = np.ones(vectors.shape[1]) if attention_mask is None else attention_mask.reshape(-1)
            if weights.shape[0] != vectors.shape[1]:
                raise PipelineInputError(500, f"attention mask of {weights.shape[0]} tokens for {vectors.shape[1]}")
            pooled = (vectors[0] * weights[:, None]).sum(axis=0) / max(float(weights.sum()), 1e-9)
    else:
        want = "(1, D)" if post.pool == "none" else "(1, T, D)"
        raise PipelineInputError(500, f"an embedding with pool {post.pool!r} needs a {want} output, got {output.shape}")
    if not np.isfinite(pooled).all():
        raise PipelineInputError(500, "the model's embedding has NaN or Inf")
    if post.normalize:
        pooled = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
    return [float(v) for v in pooled]
