"""Accuracy metrics and gates used to accept or drop a variant."""

from __future__ import annotations

import numpy as np
from edgesdk.converters.validate import choose_metric, passes, score

from edgesdk.schemas.manifest import TensorSpec


def test_metric_is_chosen_from_the_output_shape() -> None:
    assert choose_metric([TensorSpec(name="logits", dtype="float32", shape=["batch", 10])]) == "top1"
    assert choose_metric([TensorSpec(name="emb", dtype="float32", shape=["batch", 16, 64])]) == "cosine"
    assert choose_metric([TensorSpec(name="score", dtype="float32", shape=["batch", 1])]) == "cosine"


def test_top1_agreement_counts_matching_argmax() -> None:
    ref = {"logits": np.array([[0, 1.0], [1.0, 0], [1.0, 0], [0, 1.0]])}
    out = {"logits": np.array([[0, 2.0], [3.0, 0], [0, 1.0], [0, 5.0]])}
    assert score("top1", out, ref) == 0.75
    assert not passes("top1", 0.75, 0.99) and passes("top1", 0.99, 0.99)


def test_cosine_takes_the_worst_output_and_max_abs_the_largest() -> None:
    ref = {"a": np.ones((2, 4)), "b": np.ones((2, 4))}
    out = {"a": np.ones((2, 4)), "b": np.array([[1, 1, 1, 1], [1, -1, 1, -1.0]])}
    assert score("cosine", out, ref) == 0.5  # mean over samples of b: (1 + 0) / 2
    assert score("max_abs", out, ref) == 2.0
    assert passes("max_abs", 1e-4, 1e-3) and not passes("max_abs", 2.0, 1e-3)
