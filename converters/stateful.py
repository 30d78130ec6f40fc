"""Stateful models: state pairs, and validation over a stream with the state fed back.

A recurrent model (a voice-activity detector, a keyword spotter) takes its state as an input
and returns the next one (``state → stateN``, ``h0 → hn``). One step agreeing with the
reference says little: errors in the state compound. So when a model has state pairs and its
data has a leading step axis on the other inputs (``audio [T, N, 512]`` beside the initial
``state [2, N, 128]``), every sample is run as a stream: step t feeds step t's inputs and the
state the *same* model returned at step t-1 — the variant its own, the reference its own — and
the gate scores the outputs of all steps, so it measures drift over the stream.

Pairs are found by name (``state``/``stateN``, ``h``/``h_out``, ``h0``/``hn``, …, same dtype
and rank) or declared (``--state state=stateN``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from edgesdk.converters.input_spec import InputLayout, Placement, sample_count

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

Run = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def _candidates(name: str) -> list[str]:
    stem = name[:-1] if name.endswith("0") else name
    return [
        f"{name}N", f"{name}n", f"{name}_out", f"{name}_next", f"next_{name}", f"new_{name}", f"{name}_new",
        f"out_{name}", f"{stem}n", f"{stem}N", f"{name}out", f"{name}_1",
    ]  # fmt: skip


def find_state_pairs(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], declared: Mapping[str, str] | None = None
) -> dict[str, str]:
    """State input → next-state output: the declared ones, else those whose names match."""
    by_name = {s.name: s for s in outputs}
    inputs_by_name = {s.name: s for s in inputs}
    if declared:
        for state, nxt in declared.items():
            if state not in inputs_by_name or nxt not in by_name:
                raise UsageError(
                    f"--state {state}={nxt}: the model has no input {state!r} or no output {nxt!r}; "
                    f"inputs: {', '.join(inputs_by_name)}; outputs: {', '.join(by_name)}"
                )
        return dict(declared)
    pairs: dict[str, str] = {}
    for spec in inputs:
        for candidate in _candidates(spec.name):
            out = by_name.get(candidate)
            if out is not None and out.dtype == spec.dtype and len(out.shape) == len(spec.shape):
                pairs[spec.name] = candidate
                break
    return pairs


def parse_state_pairs(specs: Sequence[str]) -> dict[str, str]:
    """``["state=stateN"]`` → ``{"state": "stateN"}``."""
    pairs: dict[str, str] = {}
    for spec in specs:
        state, _, nxt = spec.partition("=")
        if not state.strip() or not nxt.strip():
            raise UsageError(f"--state {spec!r}: expected INPUT=OUTPUT (e.g. state=stateN)")
        pairs[state.strip()] = nxt.strip()
    return pairs


def run_all(run: Run, layout: InputLayout, data: Mapping[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Every sample of sample-major ``data`` through ``run`` (model layout in and out), ``size``
    at a time; sample-major outputs. A stream runs step by step with its state fed back, and
    its outputs get a step axis after the sample axis: (N, T, …)."""
    chunks: list[dict[str, np.ndarray]] = []
    steps = layout.steps(data) if layout.state_pairs else 0
    count = sample_count(data)
    for start in range(0, count, size):
        part = {k: v[start : start + size] for k, v in data.items()}
        if not steps:
            chunks.append(layout.sample_major(run(layout.feed(part))))
            continue
        carried: dict[str, np.ndarray] = {}
        per_step: list[dict[str, np.ndarray]] = []
        for step in range(steps):
            feeds = layout.feed(part, step)
            feeds.update(carried)
            out = run(feeds)
            carried = {state: np.asarray(out[nxt]) for state, nxt in layout.state_pairs.items()}
            per_step.append(layout.sample_major(out))
        chunks.append({name: np.stack([s[name] for s in per_step], axis=1) for name in per_step[0]})
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}


def drift(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[float]:
    """Max |difference| over every output, per step of the streams (outputs are (N, T, …))."""
    steps = next(iter(reference.values())).shape[1]
    return [
        max(
            float(np.abs(outputs[n][:, t].astype(np.float64) - ref[:, t].astype(np.float64)).max())
            for n, ref in reference.items()
        )
        for t in range(steps)
    ]


def calibration_steps(
    layout: InputLayout, data: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Calibration streams → one sample per step, each with the state the reference model
    reached there (``outputs``: its run_all outputs on ``data``), not the initial state at every
    step, on which a quantizer would calibrate the state input (zeros, often). Returned in the
    same layout with streams of one step: (N·T, 1, …)."""
    steps = layout.steps(data)
    if not layout.state_pairs or not steps:
        return dict(data)
    count = sample_count(data)
    flat: dict[str, np.ndarray] = {}
    for name, value in data.items():
        if name in layout.state_pairs:
            reached = outputs[layout.state_pairs[name]][:, :-1]  # the state fed at steps 1..T-1
            fed = np.concatenate([np.asarray(value)[:, None], reached.astype(value.dtype)], axis=1)
            flat[name] = fed.reshape(count * steps, *fed.shape[2:])
        elif layout.of_input(name).placement == Placement.STREAMED:
            flat[name] = np.asarray(value).reshape(count * steps, 1, *value.shape[2:])
        else:
            flat[name] = np.repeat(np.asarray(value), steps, axis=0)
    return flat
