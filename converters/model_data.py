"""The data of one conversion, arranged once the model is read: calibration, validation, golden.

The layout of every input comes from the first data file (or the model alone, for random
inputs); both files are checked against it and made sample-major, and the source model gets
the layout and an example taken from the data, in its own layout, for the converters that fix
shapes from an example (onnx2tf, Core ML).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from edgesdk.converters.base import SourceModel
from edgesdk.converters.data import check_against_inputs, subset, synthetic_inputs
from edgesdk.converters.input_spec import Placement, TensorLayout, resolve_layout, sized_like
from edgesdk.converters.stateful import find_state_pairs


def arrange_data(
    source: SourceModel,
    raw_calibration: Mapping[str, np.ndarray] | None,
    cal_where: str,
    raw_validation: Mapping[str, np.ndarray] | None,
    val_where: str,
    batch_axes: Mapping[str, int | str] | None,
    state_pairs: Mapping[str, str] | None = None,
) -> tuple[SourceModel, dict[str, np.ndarray] | None, dict[str, np.ndarray], list[str]]:
    """(source with its layout, sample-major calibration, sample-major validation, decisions)."""
    decisions: list[str] = []
    pairs = find_state_pairs(source.inputs, source.outputs, state_pairs)
    first, what, where = (
        (raw_calibration, "calibration", cal_where) if raw_calibration else (raw_validation, "validation", val_where)
    )
    layout = resolve_layout(
        source.inputs, source.outputs, first or None, batch_axes, what=what, where=where, state_pairs=pairs
    )
    cal = (
        check_against_inputs(raw_calibration, source.inputs, "calibration", cal_where, layout, batch_axes)
        if raw_calibration
        else None
    )
    if raw_validation:
        val = check_against_inputs(raw_validation, source.inputs, "validation", val_where, layout, batch_axes)
    elif cal:
        val = cal
        decisions.append(
            "WARNING: no --validation data: validating on the calibration data, which flatters int8 "
            "(its ranges were fitted on these samples); give a disjoint --validation set"
        )
    else:
        sized, unsized = sized_like(source.inputs, source.example, layout)  # --input sizes dynamic axes
        val = synthetic_inputs(sized, 32, layout=layout)
        decisions.append("no --validation or --calibration data: validating on 32 random inputs (less meaningful)")
        decisions += [f"WARNING: {line}" for line in unsized]
    if not layout.is_plain:
        placed = ", ".join(
            f"{name}: " + (f"axis {t.axis}" if t.placement == Placement.BATCHED else t.placement.value)
            for name, t in layout.inputs.items()
        )
        decisions.append(f"samples per input (the model's own layout): {placed}")
    if layout.state_pairs:
        steps = layout.steps(val)
        fed = ", ".join(f"{a} → {b}" for a, b in layout.state_pairs.items())
        decisions.append(
            f"stateful: {fed} fed back over streams of {steps} steps; the gate scores every step, so it measures "
            "drift over a stream (calibration sees every step, with the state the source model reached there)"
        )
    elif pairs:
        fed = ", ".join(f"{a} → {b}" for a, b in pairs.items())
        decisions.append(
            f"state pairs {fed} found, but no input has a step axis: validated one step at a time "
            "(give the other inputs a leading step axis to validate streams)"
        )
    example = layout.feed(subset(cal if cal is not None else val, 1))
    if source.torch_module is not None:
        example = source.example  # the export fixed its shapes from this one
    return dataclasses.replace(source, layout=layout, example=example), cal, val, decisions


#: Uncompressed bytes of golden.npz's inputs and outputs past which it holds fewer samples (at least one).
GOLDEN_BYTES = 1 << 20


def golden_set(
    source: SourceModel, data: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], count: int
) -> dict[str, np.ndarray]:
    """golden.npz: inputs and ``output:<name>`` as one batch in the model's layout, the way the
    agent's smoke test feeds them. A model that takes one sample per call gets one sample."""
    layout = source.layout
    if not layout.is_plain:
        count = 1  # the device's fallback splits a batch on axis 0: one sample is right in any layout
    # A few samples, not a second model: 8 detector images of 640x640 made a 13.1 MB golden file
    # for a 4.7 MB model (issue 38), and the device runs the whole file as one batch.
    per_sample = sum(np.asarray(v[:1]).nbytes for v in [*data.values(), *reference.values()])
    count = max(1, min(count, GOLDEN_BYTES // max(per_sample, 1)))
    inputs = layout.feed(subset(data, count))
    golden = {k: np.asarray(v) for k, v in inputs.items()}
    for name, value in reference.items():
        first_step = value[:count, 0] if layout.state_pairs else value[:count]  # streams: (N, T, …)
        golden[f"output:{name}"] = _to_model_layout(layout.of_output(name), first_step)
    return golden


def _to_model_layout(layout: TensorLayout, value: np.ndarray) -> np.ndarray:
    if layout.placement == Placement.BATCHED:
        return np.ascontiguousarray(np.moveaxis(value, 0, layout.axis))
    return np.array(value[0])
