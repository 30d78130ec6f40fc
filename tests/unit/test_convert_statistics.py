"""Gate statistics: confidence bounds, the samples a gate needs, calibration/validation overlap."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.statistics import (
    bootstrap_mean_lower,
    check_disjoint,
    cluster_bootstrap_lower,
    minimum_samples_sentence,
    per_sample,
    read_gate,
    samples_needed_for_agreement,
    wilson_lower,
)

from edgesdk.errors import UsageError


def test_wilson_bound_matches_the_closed_form_and_tightens_with_samples() -> None:
    # 21/22 (the old MobileNetV2 gate): one-sided 95% Wilson bound, computed by hand.
    z = 1.6448536269514722
    n, p = 22, 21 / 22
    expected = (p + z * z / (2 * n) - z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)
    assert wilson_lower(21, 22) == pytest.approx(expected, abs=1e-12)
    assert wilson_lower(21, 22) < 0.95 < 21 / 22
    assert wilson_lower(210, 220) > wilson_lower(21, 22)
    assert wilson_lower(0, 10) == 0.0 and wilson_lower(0, 0) == 0.0


def test_a_pass_on_22_samples_is_inconclusive_and_says_how_many_would_tell() -> None:
    agree = np.array([1.0] * 21 + [0.0])
    reading = read_gate("top1", float(agree.mean()), 0.95, agree)
    assert reading.verdict == "inconclusive"
    assert reading.samples_needed and reading.samples_needed > 22
    assert "inconclusive" in reading.sentence("top1", 0.95)
    many = np.array([1.0] * 990 + [0.0] * 10)
    assert read_gate("top1", 0.99, 0.95, many).verdict == "pass"
    assert read_gate("top1", 0.9, 0.95, np.array([1.0] * 9 + [0.0])).verdict == "fail"


def test_samples_needed_is_the_least_n_whose_bound_reaches_the_gate() -> None:
    for gate, observed in ((0.95, 1.0), (0.93, 0.97), (0.99, 0.995)):
        n = samples_needed_for_agreement(gate, observed)
        assert wilson_lower(round(observed * n), n) >= gate
        assert wilson_lower(round(observed * (n - 1)), n - 1) < gate or observed < 1.0
    assert samples_needed_for_agreement(0.95, 0.95) == 0  # at the gate itself: never
    assert "52" in minimum_samples_sentence("top1", 0.95)  # 0.95 z² / 0.05 = 51.4


def test_bootstrap_bound_is_below_the_mean_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(1)
    few = 0.995 + 0.004 * rng.standard_normal(20)
    many = 0.995 + 0.004 * rng.standard_normal(2000)
    assert bootstrap_mean_lower(few) < few.mean()
    assert few.mean() - bootstrap_mean_lower(few) > many.mean() - bootstrap_mean_lower(many)
    assert bootstrap_mean_lower(few) == bootstrap_mean_lower(few)  # seeded: reproducible
    reading = read_gate("cosine", float(few.mean()), 0.99, few)
    assert reading.lower_bound is not None and reading.lower_bound < reading.value


def test_views_of_one_photo_widen_the_bound_to_what_the_photos_warrant() -> None:
    # 40 photos, 8 views each; 4 photos disagree on every view: 90 % either way.
    agree = np.repeat(np.r_[np.zeros(4), np.ones(36)], 8)
    photos = np.repeat(np.arange(40), 8)
    clustered = cluster_bootstrap_lower(agree, photos)
    assert clustered < bootstrap_mean_lower(agree) < 0.9  # 320 "independent" samples claim too much
    assert clustered == pytest.approx(cluster_bootstrap_lower(agree[::8], photos[::8]), abs=0.01)
    assert cluster_bootstrap_lower(agree, np.arange(agree.size)) == pytest.approx(bootstrap_mean_lower(agree), abs=0.01)


def test_per_sample_values_are_what_the_score_averages() -> None:
    reference = {"a": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])}
    outputs = {"a": np.array([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])}
    assert per_sample("top1", outputs, reference).tolist() == [1.0, 0.0, 1.0]
    cosines = per_sample("cosine", outputs, reference)
    assert cosines[1] == pytest.approx(0.0) and cosines[2] == pytest.approx(1.0)


def test_overlapping_calibration_and_validation_are_refused_naming_the_count() -> None:
    rng = np.random.default_rng(0)
    cal = {"x": rng.standard_normal((10, 3)).astype(np.float32)}
    val = {"x": np.concatenate([rng.standard_normal((5, 3)).astype(np.float32), cal["x"][2:4]])}
    with pytest.raises(UsageError, match="repeats 2 of its 7 samples"):
        check_disjoint(cal, val)
    disjoint = {"x": rng.standard_normal((4, 3)).astype(np.float32)}
    assert check_disjoint(cal, disjoint) == 0
    twice = {"x": np.concatenate([disjoint["x"], disjoint["x"][:1]])}
    assert check_disjoint(cal, twice) == 1  # repeated inside validation: counted, not refused
