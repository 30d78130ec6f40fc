"""State pairs are found by name, and a stream runs step by step with the state fed back."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.data import check_against_inputs
from edgesdk.converters.input_spec import Placement, resolve_layout
from edgesdk.converters.stateful import drift, find_state_pairs, parse_state_pairs, run_all

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

X = TensorSpec(name="x", dtype="float32", shape=["batch", 3])
STATE = TensorSpec(name="state", dtype="float32", shape=[2, "batch", 3])
Y = TensorSpec(name="y", dtype="float32", shape=["batch", 3])
STATE_N = TensorSpec(name="stateN", dtype="float32", shape=[2, "batch", 3])


@pytest.mark.parametrize(
    ("state", "nxt"), [("state", "stateN"), ("h0", "hn"), ("h", "h_out"), ("c", "next_c"), ("cache", "cache_new")]
)
def test_pairs_are_found_by_name(state, nxt) -> None:
    specs = [TensorSpec(name=state, dtype="float32", shape=[1, 4])]
    outs = [
        TensorSpec(name="logits", dtype="float32", shape=[1, 2]),
        TensorSpec(name=nxt, dtype="float32", shape=[1, 4]),
    ]
    assert find_state_pairs(specs, outs) == {state: nxt}


def test_no_pair_when_dtype_or_rank_differ_and_declared_pairs_are_checked() -> None:
    assert find_state_pairs([STATE], [TensorSpec(name="stateN", dtype="int64", shape=[2, "batch", 3])]) == {}
    assert find_state_pairs([STATE], [TensorSpec(name="stateN", dtype="float32", shape=["batch", 3])]) == {}
    with pytest.raises(UsageError, match="no input 'memory' or no output 'stateN'"):
        find_state_pairs([STATE], [STATE_N], {"memory": "stateN"})
    assert parse_state_pairs(["state=stateN"]) == {"state": "stateN"}
    with pytest.raises(UsageError, match="expected INPUT=OUTPUT"):
        parse_state_pairs(["state"])


def _cell(feeds):
    """y = x + state[0]; stateN = [y, state[0]]: the state carries a running sum."""
    y = feeds["x"] + feeds["state"][0]
    return {"y": y, "stateN": np.stack([y, feeds["state"][0]])}


def test_a_stream_feeds_the_state_back_and_scores_every_step() -> None:
    steps, count = 4, 3
    data = {"x": np.ones((steps, count, 3), np.float32), "state": np.zeros((2, count, 3), np.float32)}
    pairs = find_state_pairs([X, STATE], [Y, STATE_N])
    layout = resolve_layout([X, STATE], [Y, STATE_N], data, state_pairs=pairs)
    assert layout.of_input("x").placement == Placement.STREAMED and layout.state_pairs == {"state": "stateN"}
    major = check_against_inputs(data, [X, STATE], "validation", "v.npz", layout)
    assert major["x"].shape == (count, steps, 3) and layout.steps(major) == steps
    outputs = run_all(_cell, layout, major, size=2)
    assert outputs["y"].shape == (count, steps, 3)
    # The running sum: step t gives t + 1 only if each step saw the state of the one before.
    np.testing.assert_array_equal(outputs["y"][0, :, 0], [1, 2, 3, 4])
    off = {k: v.copy() for k, v in outputs.items()}
    off["y"][:, -1] += 0.5
    assert drift(off, outputs) == [0.0, 0.0, 0.0, 0.5]
    # Calibration sees every step of every stream (with the initial state).
    assert len(list(layout.samples(major))) == count * steps


def test_without_a_step_axis_the_pairs_are_dropped_and_steps_run_alone() -> None:
    data = {"x": np.ones((3, 3), np.float32), "state": np.zeros((2, 3, 3), np.float32)}
    layout = resolve_layout([X, STATE], [Y, STATE_N], data, state_pairs={"state": "stateN"})
    assert layout.state_pairs == {} and layout.of_input("x").placement == Placement.BATCHED


def test_calibration_steps_carry_the_state_the_reference_reached() -> None:
    from edgesdk.converters.stateful import calibration_steps

    steps, count = 3, 2
    data = {"x": np.ones((steps, count, 3), np.float32), "state": np.zeros((2, count, 3), np.float32)}
    layout = resolve_layout([X, STATE], [Y, STATE_N], data, state_pairs={"state": "stateN"})
    major = check_against_inputs(data, [X, STATE], "calibration", "c.npz", layout)
    flat = calibration_steps(layout, major, run_all(_cell, layout, major, size=2))
    assert flat["x"].shape == (count * steps, 1, 3) and flat["state"].shape == (count * steps, 2, 3)
    # Stream 0 step by step: the state fed is 0, then 1, then 2 (the running sum so far), not 0 every time.
    np.testing.assert_array_equal(flat["state"][:steps, 0, 0], [0, 1, 2])
    feeds = list(layout.samples(flat))
    assert len(feeds) == count * steps and feeds[2]["state"][0, 0, 0] == 2
