"""Where the samples are in each input: the model's own layout, not "axis 0 of every array".

A data file keeps every array in the layout the model takes (a recurrent state ``[2, batch,
128]`` keeps its batch on axis 1). The sample axis of each input comes, in this order, from an
explicit declaration (``--batch-axis state=1``, ``none`` for a constant), from the model's
symbolic dimension names (``batch``, ``N``, ``batch_size``, …), from a leading batch-like axis
0 (dynamic or fixed at 1), or from the only axis fixed at 1. An array with one axis more than
the input stacks samples the model takes without a batch axis (one per call); a 0-d array is a
constant fed to every sample.

Inside the pipeline the data is *sample-major* (axis 0 of every array is the sample, constants
broadcast along it), so counting, slicing and subsets stay simple; :meth:`InputLayout.feed`
turns a slice back into the model's layout just before a runtime sees it, and
:meth:`InputLayout.sample_major` does the reverse for what the model returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

#: Symbolic dimension names that mean "the batch" (torch.onnx's ``batch``, tf2onnx's ``N``, …).
BATCH_DIM_NAMES = re.compile(r"^(n|b|bs|batch|batches|batch_?size|num_?samples|samples?|batch_\w+|\w+_batch)$", re.I)

#: What ``--batch-axis NAME=none`` (or a data spec) declares: the array is the same for every sample.
CONSTANT = "none"


class Placement(str, Enum):
    """How one input's samples are laid out."""

    BATCHED = "batched"  # samples along the model's batch axis
    UNBATCHED = "unbatched"  # the model takes one sample without a batch axis; the file stacks them
    STREAMED = "streamed"  # a stateful model's stream: the file has a leading step axis, then the model's layout
    CONSTANT = "constant"  # one array fed with every sample


@dataclass(frozen=True)
class TensorLayout:
    placement: Placement
    #: The model's axis of the samples (BATCHED only).
    axis: int = 0


@dataclass(frozen=True)
class InputLayout:
    """Per input and output: where its samples are. Names it does not know are batched on axis 0."""

    inputs: Mapping[str, TensorLayout] = field(default_factory=dict)
    outputs: Mapping[str, TensorLayout] = field(default_factory=dict)
    #: A stateful model's state input → the output that carries it to the next step (stateful.py).
    state_pairs: Mapping[str, str] = field(default_factory=dict)

    def steps(self, data: Mapping[str, np.ndarray]) -> int:
        """Steps per stream in sample-major ``data`` (0: not streamed)."""
        for name, layout in self.inputs.items():
            if layout.placement == Placement.STREAMED and name in data:
                return int(data[name].shape[1])
        return 0

    def of_input(self, name: str) -> TensorLayout:
        return self.inputs.get(name, _AXIS0)

    def of_output(self, name: str) -> TensorLayout:
        return self.outputs.get(name, _AXIS0)

    @property
    def is_plain(self) -> bool:
        """Every tensor batched on axis 0: the model's layout is the sample-major one."""
        return all(t == _AXIS0 for t in [*self.inputs.values(), *self.outputs.values()])

    def batch_size(self, specs: Sequence[TensorSpec], wanted: int = 64) -> int:
        """Samples per call: 1 when an input has no batch axis or its batch axis is fixed."""
        for spec in specs:
            layout = self.of_input(spec.name)
            if layout.placement == Placement.UNBATCHED:
                return 1
            if layout.placement in (Placement.BATCHED, Placement.STREAMED) and layout.axis < len(spec.shape):
                if isinstance(spec.shape[layout.axis], int):
                    return 1
        return wanted

    def feed(self, batch: Mapping[str, np.ndarray], step: int = 0) -> dict[str, np.ndarray]:
        """Sample-major slice → the arrays in the model's layout, ready for a runtime (a streamed
        input at ``step`` of its stream)."""
        out: dict[str, np.ndarray] = {}
        for name, value in batch.items():
            layout = self.of_input(name)
            if layout.placement == Placement.STREAMED:
                value = value[:, step]
            if layout.placement in (Placement.BATCHED, Placement.STREAMED):
                out[name] = value if layout.axis == 0 else np.ascontiguousarray(np.moveaxis(value, 0, layout.axis))
            else:
                # A constant is the same in every row; an unbatched input is fed one sample per call.
                out[name] = np.array(value[0])  # np.array keeps a 0-d array 0-d
        return out

    def sample_major(self, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What the model returned for one call → sample-major (axis 0 the sample)."""
        result: dict[str, np.ndarray] = {}
        for name, value in outputs.items():
            layout = self.of_output(name)
            if layout.placement == Placement.BATCHED and np.ndim(value) > layout.axis:
                result[name] = value if layout.axis == 0 else np.moveaxis(value, layout.axis, 0)
            else:
                result[name] = np.asarray(value)[None]
        return result

    def samples(self, data: Mapping[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """One feed per sample, in the model's layout (calibration readers take them one by one)."""
        count, steps = sample_count(data), self.steps(data)
        for index in range(count):
            one = {k: v[index : index + 1] for k, v in data.items()}
            # A stream gives one feed per step, each with the data's state (the pipeline first gives
            # calibration streams the states the source reached: source.calibration_states).
            for step in range(max(steps, 1)):
                yield self.feed(one, step)

    def batches(self, data: Mapping[str, np.ndarray], size: int) -> Iterator[dict[str, np.ndarray]]:
        """Feeds of up to ``size`` samples, in the model's layout."""
        count = sample_count(data)
        for start in range(0, count, size):
            yield self.feed({k: v[start : start + size] for k, v in data.items()})


_AXIS0 = TensorLayout(Placement.BATCHED, 0)


def sample_count(data: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(data.values())).shape[0]) if data else 0


def parse_batch_axes(specs: Sequence[str]) -> dict[str, int | str]:
    """``["state=1", "sr=none"]`` → ``{"state": 1, "sr": "none"}``; one clear line when malformed."""
    declared: dict[str, int | str] = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        value = value.strip().lower()
        if not name or not (value.isdigit() or value == CONSTANT):
            raise UsageError(f"--batch-axis {spec!r}: expected NAME=AXIS or NAME=none (e.g. state=1, sr=none)")
        declared[name.strip()] = int(value) if value.isdigit() else CONSTANT
    return declared


def _fmt_shape(shape: Sequence[object]) -> str:
    dims = ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def model_batch_axis(spec: TensorSpec) -> int | None:
    """The axis of ``spec`` that holds the batch, read from the model alone (None: none found)."""
    shape = spec.shape
    named = [i for i, d in enumerate(shape) if isinstance(d, str) and BATCH_DIM_NAMES.match(d)]
    if len(named) == 1:
        return named[0]
    if shape and (shape[0] is None or isinstance(shape[0], str) or shape[0] == 1):
        return 0
    ones = [i for i, d in enumerate(shape) if d == 1 or d is None]
    return ones[0] if len(ones) == 1 else None


def sized_like(
    specs: Sequence[TensorSpec], example: Mapping[str, np.ndarray], layout: InputLayout
) -> tuple[list[TensorSpec], list[str]]:
    """``specs`` with each dynamic axis but the batch sized as in ``example`` (one sample in the
    model's layout: ``--input x=1x3x640x640``, or the data's first sample), for random inputs;
    and one sentence per input left at size 1 there, naming the flag that sizes it."""
    sized: list[TensorSpec] = []
    unsized: list[str] = []
    for spec in specs:
        placed = layout.of_input(spec.name)
        batch = placed.axis if placed.placement in (Placement.BATCHED, Placement.STREAMED) else None
        given = np.shape(example[spec.name]) if spec.name in example else ()
        dims = list(spec.shape)
        for axis, dim in enumerate(dims):
            if not isinstance(dim, int) and axis != batch:
                dims[axis] = int(given[axis]) if len(given) == len(dims) else 1
        ones = [i for i, d in enumerate(spec.shape) if not isinstance(d, int) and i != batch and dims[i] == 1]
        if ones:
            shape = "x".join(
                "1" if i == batch else str(d) if isinstance(d, int) else "?" for i, d in enumerate(spec.shape)
            )
            unsized.append(
                f"input {spec.name!r} has shape {_fmt_shape(spec.shape)}: dynamic axes {', '.join(map(str, ones))} "
                f"validated at size 1 on random inputs; give their sizes with --input {spec.name}={shape} "
                "(each ? a size) or give --validation data"
            )
        sized.append(spec.model_copy(update={"shape": dims}))
    return sized, unsized


def _fits(found: Sequence[int], expected: Sequence[object], skip: int | None) -> bool:
    return len(found) == len(expected) and all(
        i == skip or not isinstance(want, int) or want == got for i, (got, want) in enumerate(zip(found, expected))
    )


def layout_of_input(
    spec: TensorSpec,
    array: np.ndarray,
    declared: int | str | None,
    what: str,
    where: str,
    streamed: bool = False,
) -> TensorLayout:
    """Where ``array``'s samples are for ``spec``, or one line naming the input and both shapes.

    ``streamed``: the model is stateful and this is not a state input, so one axis more than
    the input is a leading step axis (a stream per sample), not stacked samples."""
    found, expected = tuple(array.shape), spec.shape
    rank = len(expected)
    prefix = f"{what} data {where}: input {spec.name!r} has shape {_fmt_shape(found)}; the model expects "
    if streamed and array.ndim == rank + 1 and rank > 0 and declared != CONSTANT:
        inner = layout_of_input(spec, array[0], declared, what, where)
        if inner.placement == Placement.BATCHED:
            return TensorLayout(Placement.STREAMED, inner.axis)
    if array.ndim == 0:
        if rank == 0:
            return TensorLayout(Placement.CONSTANT)
        raise UsageError(prefix + f"{_fmt_shape(expected)} (a 0-d array is a constant for a 0-d input only)")
    if declared == CONSTANT:
        if _fits(found, expected, None):
            return TensorLayout(Placement.CONSTANT)
        raise UsageError(prefix + f"{_fmt_shape(expected)} (declared constant: the array is fed as it is)")
    if array.ndim == rank + 1 and declared is None:
        if _fits(found[1:], expected, None):
            return TensorLayout(Placement.UNBATCHED)
        raise UsageError(
            prefix + f"{_fmt_shape(['N', *expected])}: one {_fmt_shape(expected)} sample per row of axis 0"
        )
    if rank == 0 and not isinstance(declared, int):
        raise UsageError(prefix + "(): a 0-d array (one value fed with every sample) or (N,) (one value per sample)")
    axis = declared if isinstance(declared, int) else model_batch_axis(spec)
    if axis is None:
        raise UsageError(
            prefix + f"{_fmt_shape(expected)} and no axis of it is a batch; "
            f"say which holds the samples with --batch-axis {spec.name}=AXIS (or {spec.name}=none for a constant)"
        )
    if axis >= max(rank, 1):
        raise UsageError(
            f"{what} data {where}: --batch-axis {spec.name}={axis} is out of range; the input has {rank} axes {_fmt_shape(expected)}"
        )
    if isinstance(expected[axis], int) and expected[axis] != 1:
        raise UsageError(
            prefix + f"{_fmt_shape(expected)}, whose axis {axis} is fixed at {expected[axis]}: "
            f"--batch-axis {spec.name}={axis} names no batch axis (a batch axis is dynamic or 1)"
        )
    if not _fits(found, expected, axis):
        wanted = [("N" if i == axis else d) for i, d in enumerate(expected)]
        how = "declared" if isinstance(declared, int) else "from the model"
        raise UsageError(
            prefix + f"{_fmt_shape(wanted)}: samples on axis {axis} ({how}), "
            f"or {_fmt_shape(['N', *expected])} stacked; set another with --batch-axis {spec.name}=AXIS"
        )
    return TensorLayout(Placement.BATCHED, axis)


def output_layouts(
    outputs: Sequence[TensorSpec], inputs: Sequence[TensorSpec], layouts: Mapping[str, TensorLayout],
    declared: Mapping[str, int | str], state_pairs: Mapping[str, str] | None = None,
) -> dict[str, TensorLayout]:  # fmt: skip
    """Where each output's samples are: on the axis named like a batched input's batch dim; a
    state output where its state input has them (Silero VAD's ``stateN [2, ?, 128]``: axis 1,
    which unnamed dims alone cannot tell)."""
    carried = _carried_state_axes(inputs, layouts, state_pairs or {})
    batch_names = {
        spec.shape[layouts[spec.name].axis]
        for spec in inputs
        if spec.name in layouts
        and layouts[spec.name].placement in (Placement.BATCHED, Placement.STREAMED)
        and isinstance(spec.shape[layouts[spec.name].axis], str)
    }
    batched = any(t.placement in (Placement.BATCHED, Placement.STREAMED) for t in layouts.values()) or not layouts
    result: dict[str, TensorLayout] = {}
    for spec in outputs:
        wanted = declared.get(spec.name)
        if isinstance(wanted, int):
            result[spec.name] = TensorLayout(Placement.BATCHED, wanted)
            continue
        same = [i for i, d in enumerate(spec.shape) if isinstance(d, str) and d in batch_names]
        if wanted is None and (spec.name, len(spec.shape)) in carried:
            result[spec.name] = TensorLayout(Placement.BATCHED, carried[spec.name, len(spec.shape)])
        elif not batched or not spec.shape or wanted == CONSTANT:
            result[spec.name] = TensorLayout(Placement.UNBATCHED)
        elif len(same) == 1:
            result[spec.name] = TensorLayout(Placement.BATCHED, same[0])
        else:
            axis = model_batch_axis(spec)
            result[spec.name] = TensorLayout(Placement.BATCHED, 0 if axis is None else axis)
    return result


def _carried_state_axes(
    inputs: Sequence[TensorSpec], layouts: Mapping[str, TensorLayout], state_pairs: Mapping[str, str]
) -> dict[tuple[str, int], int]:
    """(state output, its rank) → the batch axis of the state input it carries to the next step."""
    carried = {}
    for spec in inputs:
        layout = layouts.get(spec.name)
        if spec.name in state_pairs and layout and layout.placement in (Placement.BATCHED, Placement.STREAMED):
            carried[state_pairs[spec.name], len(spec.shape)] = layout.axis
    return carried


def resolve_layout(
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    data: Mapping[str, np.ndarray] | None,
    declared: Mapping[str, int | str] | None = None,
    *,
    what: str = "",
    where: str = "",
    state_pairs: Mapping[str, str] | None = None,
) -> InputLayout:
    """The layout of every input (from ``data`` when given, else from the model) and output."""
    pairs = dict(state_pairs or {})
    declared = dict(declared or {})
    known = {s.name for s in inputs} | {s.name for s in outputs}
    unknown = sorted(set(declared) - known)
    if unknown:
        raise UsageError(
            f"--batch-axis names {', '.join(map(repr, unknown))}, which the model does not have; "
            f"inputs: {', '.join(s.name for s in inputs)}; outputs: {', '.join(s.name for s in outputs)}"
        )
    layouts: dict[str, TensorLayout] = {}
    for spec in inputs:
        if data is not None and spec.name in data:
            streamed = bool(pairs) and spec.name not in pairs
            layouts[spec.name] = layout_of_input(spec, data[spec.name], declared.get(spec.name), what, where, streamed)
        elif not spec.shape or declared.get(spec.name) == CONSTANT:
            layouts[spec.name] = TensorLayout(Placement.CONSTANT)
        else:
            wanted = declared.get(spec.name)
            axis = wanted if isinstance(wanted, int) else model_batch_axis(spec)
            layouts[spec.name] = TensorLayout(Placement.BATCHED, 0 if axis is None else axis)
    outputs_at = output_layouts(outputs, inputs, layouts, declared, pairs)
    if pairs and not any(t.placement == Placement.STREAMED for t in layouts.values()):
        pairs = {}  # no input has a step axis: single steps, validated as a plain model
    return InputLayout(inputs=layouts, outputs=outputs_at, state_pairs=pairs)


def to_sample_major(
    data: Mapping[str, np.ndarray],
    inputs: Sequence[TensorSpec],
    layout: InputLayout,
    declared: Mapping[str, int | str] | None,
    what: str,
    where: str,
) -> dict[str, np.ndarray]:
    """Model-layout arrays → sample-major ones, after checking each against ``layout``."""
    moved: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for spec in inputs:
        array = data[spec.name]
        streamed = bool(layout.state_pairs) and spec.name not in layout.state_pairs
        expected = layout_of_input(spec, array, (declared or {}).get(spec.name), what, where, streamed)
        if expected != layout.of_input(spec.name):
            raise UsageError(
                f"{what} data {where}: input {spec.name!r} has shape {_fmt_shape(array.shape)}, laid out "
                f"{expected.placement.value}; the other data file has it {layout.of_input(spec.name).placement.value}"
            )
        if expected.placement == Placement.BATCHED:
            moved[spec.name] = np.moveaxis(array, expected.axis, 0)
        elif expected.placement == Placement.STREAMED:
            moved[spec.name] = np.moveaxis(array, expected.axis + 1, 0)  # (T, …) → (N, T, …)
        elif expected.placement == Placement.UNBATCHED:
            moved[spec.name] = array
        else:
            continue
        counts[spec.name] = moved[spec.name].shape[0]
        if counts[spec.name] == 0:
            raise UsageError(f"{what} data {where}: input {spec.name!r} has no samples")
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise UsageError(f"{what} data {where}: inputs have different sample counts ({listed})")
    steps = {k: moved[k].shape[1] for k in moved if layout.of_input(k).placement == Placement.STREAMED}
    if len(set(steps.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in steps.items())
        raise UsageError(f"{what} data {where}: streamed inputs have different step counts (axis 0: {listed})")
    count = next(iter(counts.values()), 1)
    for spec in inputs:
        if spec.name not in moved:
            constant = np.asarray(data[spec.name])
            moved[spec.name] = np.broadcast_to(constant, (count, *constant.shape))
    return {spec.name: moved[spec.name] for spec in inputs}


def first_sample(
    data: Mapping[str, np.ndarray], declared: Mapping[str, int | str] | None = None
) -> dict[str, np.ndarray]:
    """One sample of model-layout ``data`` before the model is read (a PyTorch example input):
    along the declared axis or axis 0; constants (0-d or declared ``none``) as they are."""
    declared = declared or {}
    out: dict[str, np.ndarray] = {}
    for name, value in data.items():
        axis = declared.get(name, 0)
        if value.ndim == 0 or axis == CONSTANT:
            out[name] = np.array(value)
        else:
            out[name] = np.ascontiguousarray(np.take(value, [0], axis=int(axis)))
    return out
