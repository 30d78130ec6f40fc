"""Calibration/validation files are checked against the model's inputs with clear messages."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.data import check_against_inputs, load_npz, synthetic_inputs

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

IMAGE = [TensorSpec(name="image", dtype="float32", shape=["batch", 1, 8, 8])]


def test_good_data_passes_and_extra_keys_are_ignored() -> None:
    data = {"image": np.zeros((5, 1, 8, 8), np.float32), "labels": np.zeros(5, np.int64)}
    assert list(check_against_inputs(data, IMAGE, "calibration", "c.npz")) == ["image"]


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        ({"image": np.zeros((5, 1, 8, 8), np.float64)}, ["'image'", "float64", "float32", "c.npz"]),
        ({"image": np.zeros((5, 3, 8, 8), np.float32)}, ["'image'", "(5, 3, 8, 8)", "(N, 1, 8, 8)"]),
        ({"image": np.zeros((5, 8, 8), np.float32)}, ["(5, 8, 8)"]),
        ({"pixels": np.zeros((5, 1, 8, 8), np.float32)}, ["no array for input 'image'", "pixels"]),
        ({"image": np.zeros((0, 1, 8, 8), np.float32)}, ["no samples"]),
    ],
)
def test_bad_data_names_the_input_and_both_shapes_or_dtypes(data, needles) -> None:
    with pytest.raises(UsageError) as caught:
        check_against_inputs(data, IMAGE, "calibration", "c.npz")
    message = str(caught.value)
    assert message.startswith("calibration data c.npz:")
    for needle in needles:
        assert needle in message


def test_sample_counts_must_agree_across_inputs() -> None:
    specs = [
        TensorSpec(name="ids", dtype="int64", shape=["batch", 16]),
        TensorSpec(name="mask", dtype="int64", shape=["batch", 16]),
    ]
    with pytest.raises(UsageError, match="different sample counts"):
        check_against_inputs(
            {"ids": np.zeros((4, 16), np.int64), "mask": np.zeros((3, 16), np.int64)}, specs, "validation", "v.npz"
        )


def test_unreadable_files(tmp_path) -> None:
    with pytest.raises(UsageError, match="file not found"):
        load_npz(tmp_path / "missing.npz", "calibration")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a readable .npz"):
        load_npz(bad, "validation")


def test_synthetic_inputs_follow_dtypes_and_fix_dynamic_dims() -> None:
    specs = [TensorSpec(name="ids", dtype="int64", shape=["batch", "seq"]), *IMAGE]
    data = synthetic_inputs(specs, 3)
    assert data["ids"].dtype == np.int64 and data["ids"].shape == (3, 1)
    assert data["image"].dtype == np.float32 and data["image"].shape == (3, 1, 8, 8)
