"""A model's drift window on the device (agent/drift/window.py): counts into the reference's
bins, data-quality counts, a window per report, and counts only when the bundle has no profile."""

from __future__ import annotations

import numpy as np
from edgesdk.agent.drift.window import ModelWindow

from edgesdk.drift.profile import build_profile


def _profile(rng: np.random.Generator):  # noqa: ANN202 - a ReferenceProfile
    images = rng.random((300, 3, 8, 8), dtype=np.float32)
    return build_profile({"x": images}, {"y": rng.normal(size=(300, 4)).astype(np.float32)}, classify=True)


def _feed(window: ModelWindow, rng: np.random.Generator, scale: float = 1.0, count: int = 40) -> None:
    for _ in range(count):
        x = rng.random((1, 3, 8, 8), dtype=np.float32) * scale
        window.add({"x": x}, {"y": rng.normal(size=(1, 4)).astype(np.float32)})


def test_a_window_like_the_reference_scores_low_and_a_scaled_one_high() -> None:
    rng = np.random.default_rng(11)
    window = ModelWindow(_profile(rng))
    _feed(window, rng)
    calm = window.report()
    assert calm.reference and calm.samples == 40 and calm.out_of_range == 0
    assert calm.inputs["x"].psi < 0.1 and calm.outputs["y"].psi < 0.25
    _feed(window, rng, scale=3.0)
    drifted = window.report()
    assert drifted.samples == 40  # the report started a new window
    assert drifted.inputs["x"].psi > 0.25 and drifted.out_of_range == 40


def test_data_quality_counts_constant_nonfinite_and_refused() -> None:
    rng = np.random.default_rng(12)
    window = ModelWindow(_profile(rng))
    window.add({"x": np.full((1, 3, 8, 8), 0.5, np.float32)}, {})
    nan = rng.random((1, 3, 8, 8), dtype=np.float32)
    nan[0, 0, 0, 0] = np.nan
    window.add({"x": nan}, {})  # answered: the agent allows NaN/Inf
    quality = window.report(refused_nonfinite=3)
    assert (quality.samples, quality.constant, quality.nonfinite, quality.out_of_range) == (2, 1, 4, 0)


def test_a_model_without_a_profile_reports_counts_only() -> None:
    window = ModelWindow(None)
    window.add({"x": np.zeros((1, 4), np.float32)}, {"y": np.ones((1, 2), np.float32)})
    quality = window.report()
    assert not quality.reference and quality.samples == 1 and quality.constant == 1
    assert quality.inputs == {} and quality.outputs == {}


def test_a_tensor_of_another_rank_than_the_profile_is_not_binned() -> None:
    rng = np.random.default_rng(13)
    window = ModelWindow(_profile(rng))
    window.add({"x": rng.random((3, 8, 8), dtype=np.float32)}, {})  # three channels, no batch axis
    assert window.report().inputs == {}
