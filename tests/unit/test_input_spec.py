"""Inputs as the model defines them: where each array's samples are, and one line when they do not fit."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.data import check_against_inputs, synthetic_inputs
from edgesdk.converters.input_spec import (
    InputLayout,
    Placement,
    TensorLayout,
    first_sample,
    model_batch_axis,
    parse_batch_axes,
    resolve_layout,
)

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

AUDIO = TensorSpec(name="audio", dtype="float32", shape=["batch", 32])
STATE = TensorSpec(name="state", dtype="float32", shape=[2, "batch", 8])
SR = TensorSpec(name="sr", dtype="int64", shape=[])
PROB = TensorSpec(name="prob", dtype="float32", shape=["batch", 1])
STATE_N = TensorSpec(name="stateN", dtype="float32", shape=[2, "batch", 8])
VAD = [AUDIO, STATE, SR]


def vad_data(n: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "audio": rng.standard_normal((n, 32)).astype(np.float32),
        "state": rng.standard_normal((2, n, 8)).astype(np.float32),
        "sr": np.array(16000, np.int64),
    }


@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        (["batch", 3], 0),
        ([2, "batch", 8], 1),
        ([2, "N", 8], 1),
        ([16, "batch_size"], 1),
        ([1, 43844, 1], 0),
        ([None, 4], 0),
        ([2, 1, 8], 1),
        ([4, 4], None),
        ([], None),
    ],
)
def test_the_batch_axis_is_read_from_the_models_dims(shape, axis) -> None:
    assert model_batch_axis(TensorSpec(name="x", dtype="float32", shape=shape)) == axis


def test_each_array_keeps_the_models_layout_and_a_0d_array_is_a_constant() -> None:
    data = vad_data()
    layout = resolve_layout(VAD, [PROB, STATE_N], data)
    assert layout.of_input("state") == TensorLayout(Placement.BATCHED, 1)
    assert layout.of_input("sr").placement == Placement.CONSTANT
    assert layout.of_output("stateN") == TensorLayout(Placement.BATCHED, 1)
    major = check_against_inputs(data, VAD, "calibration", "c.npz", layout)
    assert major["state"].shape == (5, 2, 8) and major["sr"].shape == (5,)
    # Back in the model's layout, two samples at a time: the state's batch is on axis 1 again.
    feeds = next(layout.batches(major, 2))
    np.testing.assert_array_equal(feeds["state"], data["state"][:, :2])
    assert feeds["sr"].shape == () and int(feeds["sr"]) == 16000
    outputs = layout.sample_major({"stateN": feeds["state"], "prob": np.zeros((2, 1), np.float32)})
    assert outputs["stateN"].shape == (2, 2, 8)
    assert layout.batch_size(VAD) == 64


def test_one_more_axis_stacks_samples_the_model_takes_one_at_a_time() -> None:
    data = {**vad_data(), "sr": np.array([16000, 8000, 16000, 8000, 16000], np.int64)}
    layout = resolve_layout(VAD, [PROB, STATE_N], data)
    assert layout.of_input("sr").placement == Placement.UNBATCHED
    assert layout.batch_size(VAD) == 1
    major = check_against_inputs(data, VAD, "validation", "v.npz", layout)
    feeds = list(layout.samples(major))
    assert [int(f["sr"]) for f in feeds] == [16000, 8000, 16000, 8000, 16000]
    assert feeds[1]["state"].shape == (2, 1, 8)


def test_a_declared_axis_wins_and_none_makes_a_full_shape_constant() -> None:
    weights = TensorSpec(name="table", dtype="float32", shape=[4, 4])
    data = {"audio": np.zeros((3, 32), np.float32), "table": np.eye(4, dtype=np.float32)}
    with pytest.raises(UsageError, match=r"--batch-axis table=AXIS \(or table=none"):
        resolve_layout([AUDIO, weights], [], data, what="calibration", where="c.npz")
    layout = resolve_layout([AUDIO, weights], [], data, {"table": "none"})
    major = check_against_inputs(data, [AUDIO, weights], "calibration", "c.npz", layout, {"table": "none"})
    assert major["table"].shape == (3, 4, 4)
    np.testing.assert_array_equal(layout.feed({k: v[:1] for k, v in major.items()})["table"], np.eye(4))


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        # The state in a layout the model does not have.
        ({**vad_data(), "state": np.zeros((5, 2, 8), np.float32)}, ["'state'", "(5, 2, 8)", "(2, N, 8)", "axis 1"]),
        # A per-sample column for a 0-d input that is not one value per row.
        ({**vad_data(), "sr": np.zeros((5, 1), np.int64)}, ["'sr'", "(5, 1)", "a 0-d array", "(N,)"]),
        # A 0-d array for an input that is not 0-d.
        ({**vad_data(), "audio": np.array(1.0, np.float32)}, ["'audio'", "()", "(batch, 32)", "0-d"]),
        ({**vad_data(), "audio": np.zeros((5, 16), np.float32)}, ["'audio'", "(5, 16)", "(N, 32)"]),
        ({**vad_data(), "audio": np.zeros((4, 32), np.float32)}, ["different sample counts", "audio: 4", "state: 5"]),
    ],
)
def test_every_mismatch_is_one_line_naming_the_input_and_both_shapes(data, needles) -> None:
    with pytest.raises(UsageError) as caught:
        layout = resolve_layout(VAD, [PROB, STATE_N], data, what="calibration", where="c.npz")
        check_against_inputs(data, VAD, "calibration", "c.npz", layout)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("calibration data c.npz:")
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_second_file_must_lay_an_input_out_as_the_first() -> None:
    layout = resolve_layout(VAD, [], vad_data())
    per_sample = {**vad_data(), "sr": np.full(5, 16000, np.int64)}
    with pytest.raises(UsageError, match="'sr'.*unbatched; the other data file has it constant"):
        check_against_inputs(per_sample, VAD, "validation", "v.npz", layout)


def test_batch_axis_declarations_parse_or_fail_in_one_line() -> None:
    assert parse_batch_axes(["state=1", "sr=none"]) == {"state": 1, "sr": "none"}
    for bad in ("state", "state=x", "=1"):
        with pytest.raises(UsageError, match="expected NAME=AXIS or NAME=none"):
            parse_batch_axes([bad])
    with pytest.raises(UsageError, match="'bogus', which the model does not have; inputs: audio, state, sr"):
        resolve_layout(VAD, [], vad_data(), {"bogus": 1})


def test_synthetic_inputs_and_examples_follow_the_layout() -> None:
    layout = resolve_layout(VAD, [PROB, STATE_N], None)
    major = synthetic_inputs(VAD, 3, layout=layout)
    assert major["state"].shape == (3, 2, 8) and major["sr"].shape == (3,)
    assert len(set(major["sr"].tolist())) == 1  # a constant: the same value for every sample
    feeds = layout.feed({k: v[:1] for k, v in major.items()})
    assert feeds["state"].shape == (2, 1, 8) and feeds["sr"].shape == ()
    sample = first_sample(vad_data(), {"state": 1})
    assert sample["state"].shape == (2, 1, 8) and sample["audio"].shape == (1, 32) and sample["sr"].shape == ()


def test_a_plain_layout_changes_nothing() -> None:
    layout = InputLayout()
    image = np.zeros((3, 1, 8, 8), np.float32)
    assert layout.is_plain and layout.feed({"image": image})["image"] is image
