"""The drift math of issue 41 (edgesdk/drift/): PSI and Jensen-Shannon against hand-computed
values, the fixed-bin counter, and the reference profile built from validation data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from edgesdk.drift.profile import build_profile, channel_axis_of, tensor_profile
from edgesdk.drift.schema import MAX_NUMBERS, Histogram, ReferenceProfile
from edgesdk.drift.scores import bin_counts, closed_edges, js_distance, psi


def test_psi_matches_the_hand_computed_value() -> None:
    # (0.25 - 0.5) ln(0.25/0.5) + (0.75 - 0.5) ln(0.75/0.5)
    expected = -0.25 * math.log(0.5) + 0.25 * math.log(1.5)
    assert psi([0.5, 0.5], [0.25, 0.75]) == pytest.approx(expected, rel=1e-9)
    assert psi([50, 50], [25, 75]) == pytest.approx(expected, rel=1e-9)  # counts are shares too


def test_psi_of_an_empty_bin_uses_the_floor_share() -> None:
    # live puts nothing in the second bin: its share is taken as 1e-4
    live = np.array([1.0, 1e-4]) / (1 + 1e-4)
    expected = float(np.sum((np.maximum(live, 1e-4) - 0.5) * np.log(np.maximum(live, 1e-4) / 0.5)))
    assert psi([0.5, 0.5], [10, 0]) == pytest.approx(expected, rel=1e-3)
    assert psi([0.5, 0.5], [10, 0]) > 2


def test_js_distance_matches_the_hand_computed_value() -> None:
    # p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4)
    kl_p = 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25)
    kl_q = math.log2(1 / 0.75)
    assert js_distance([0.5, 0.5], [1, 0]) == pytest.approx(math.sqrt((kl_p + kl_q) / 2), rel=1e-9)
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    assert js_distance([0.2, 0.3, 0.5], [2, 3, 5]) == pytest.approx(0.0, abs=1e-7)


def test_bin_counts_puts_the_reference_maximum_in_the_last_bin() -> None:
    edges = closed_edges([0.0, 1.0, 2.0])
    counts = bin_counts(edges, np.array([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]))
    assert counts.tolist() == [1, 2, 2, 1]  # underflow, [0, 1), [1, 2], overflow


def test_channel_axis_is_found_for_images_sequences_and_tables() -> None:
    assert channel_axis_of((8, 3, 224, 224)) == -3  # NCHW
    assert channel_axis_of((8, 224, 224, 3)) == -1  # NHWC
    assert channel_axis_of((8, 1, 8, 8)) is None  # one channel: one histogram
    assert channel_axis_of((8, 64)) == -1
    assert channel_axis_of((8, 1000)) is None  # too many features: one histogram
    assert channel_axis_of((8,)) is None


def _images(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.normal(loc=[[[0.0]], [[1.0]], [[-1.0]]], scale=1.0, size=(count, 3, 16, 16)).astype(np.float32)


def _score(profile: ReferenceProfile, batch: np.ndarray) -> float:
    tensor = profile.inputs["x"]
    worst = 0.0
    for c, histogram in enumerate(tensor.histograms):
        live = bin_counts(closed_edges(histogram.edges), batch[:, c])
        worst = max(worst, psi(histogram.shares, live))
    return worst


def test_same_distribution_scores_near_zero_and_a_shifted_one_high() -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(400, 10)).astype(np.float32)
    profile = build_profile({"x": _images(rng, 400)}, {"y": logits}, classify=True)
    assert profile.inputs["x"].channel_axis == -3 and len(profile.inputs["x"].histograms) == 3
    assert profile.outputs["y"].classes is not None and profile.outputs["y"].softmax
    assert _score(profile, _images(rng, 50)) < 0.05
    assert _score(profile, _images(rng, 50) * 3) > 0.25
    assert _score(profile, -_images(rng, 50)) > 0.25  # a channel's sign flipped (mean 1 -> -1)
    assert len(profile.model_dump_json()) < 4096


def test_profile_of_a_constant_tensor_is_one_bin() -> None:
    tensor = tensor_profile(np.zeros((10, 4), dtype=np.float32))
    assert [h.edges for h in tensor.histograms] == [[0.0, 1e-6]] * 4
    assert all(h.shares == [0.0, 1.0, 0.0] for h in tensor.histograms)


def test_malformed_profiles_are_refused_by_the_schema() -> None:
    with pytest.raises(ValidationError, match="edges must increase"):
        Histogram(edges=[1.0, 0.0], shares=[0, 1, 0])
    with pytest.raises(ValidationError, match="sum to 1"):
        Histogram(edges=[0.0, 1.0], shares=[0.5, 0.9, 0])
    with pytest.raises(ValidationError, match="finite"):
        Histogram(edges=[0.0, float("inf")], shares=[0, 1, 0])
    histogram = {"edges": [float(i) for i in range(11)], "shares": [0.0] + [0.1] * 10 + [0.0]}
    tensor = {"ndim": 2, "channel_axis": -1, "min": 0, "max": 10, "histograms": [histogram] * 64}
    oversized = {"samples": 1, "inputs": {f"in{i}": tensor for i in range(6)}, "outputs": {}}
    with pytest.raises(ValidationError, match=f"over {MAX_NUMBERS}"):
        ReferenceProfile.model_validate(oversized)


def test_nonfinite_validation_values_stay_out_of_the_profile() -> None:
    tensor = tensor_profile(np.array([[1.0, np.nan], [np.inf, -2.0]]))
    assert (tensor.min, tensor.max) == (-2.0, 1.0)
    assert sum(tensor.histograms[0].shares) == pytest.approx(1.0)
