"""The end-to-end gate for boxes, masks, text and embeddings (classes: ``end_to_end.judge``).

The user's answer for each raw file is read into the shape the bundle's post step answers in
(``edgesdk.pipeline.postprocess``); each variant's answers are compared file by file with
``edgesdk.pipeline.compare.sample_figures`` and every gate of the kind reads its figure's tail
(the worst file, or a named percentile) with the mean beside it: one bad file fails a gate the
mean would pass. ``--task-gate NAME=VALUE[@pN]`` overrides one gate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import UsageError
from edgesdk.pipeline.compare import DEFAULT_GATES, MATCH_IOU, Gate, read_figure, sample_figures
from edgesdk.quality.tail_statistics import wilson_lower
from edgesdk.schemas.report import TaskAccuracy, TaskFigure

#: Each kind's answer, as the user's function or JSON may give it.
RETURNS = {
    "boxes": "{'boxes': [{'label' or 'index': ..., 'box': [x1, y1, x2, y2]}, ...]} or that list",
    "mask": "an (H, W) array of class indices (a list of rows, a numpy array or a PIL image) or {'mask': ...}",
    "ctc": "the decoded text (str) or {'text': ...}",
    "embedding": "a vector (a list of numbers or a numpy array) or {'embedding': ...}",
}
#: Files named per failed gate in the report (the worst first).
SHOWN_WORST = 3


@dataclasses.dataclass(frozen=True)
class TaskGates:
    """A kind's gates after ``--task-gate``: the tail gates, the boxes' match IoU, the top-1 gate."""

    gates: tuple[Gate, ...]
    match_iou: float = MATCH_IOU
    top1: float = 0.99

    def thresholds(self, kind: str) -> dict[str, float]:
        if kind == "classes":
            return {"top1": self.top1}
        extra = {"match_iou": self.match_iou} if kind == "boxes" else {}
        return {g.name: g.threshold for g in self.gates} | extra


def parse_task_gates(kind: str, given: float | str | Sequence[str] | None) -> TaskGates:
    """The defaults of ``kind`` with each ``NAME=VALUE[@pN]`` (or, for classes, a plain share) applied."""
    gates = {g.name: g for g in DEFAULT_GATES.get(kind, ())}
    found = TaskGates(tuple(gates.values()))
    items = [given] if isinstance(given, (float, int, str)) else list(given or ())
    for item in items:
        name, value, percentile = _split(str(item), kind)
        if name == "top1":
            found = dataclasses.replace(found, top1=_share(item, value, "a share of files in (0, 1], e.g. 0.99"))
        elif name == "match_iou":
            found = dataclasses.replace(found, match_iou=_share(item, value, "an IoU in (0, 1], e.g. 0.5"))
        else:
            gate = gates[name]
            if gate.higher_is_better:
                _share(item, value, "in (0, 1], e.g. 0.9")
            elif value < 0:
                raise UsageError(f"--task-gate {item}: {name} is an error rate, at least 0 (e.g. cer=0.1)")
            gates[name] = dataclasses.replace(gate, threshold=value, percentile=percentile)
    return dataclasses.replace(found, gates=tuple(gates.values()))


def _split(item: str, kind: str) -> tuple[str, float, float | None]:
    names = ["top1"] if kind == "classes" else [g.name for g in DEFAULT_GATES[kind]]
    names += ["match_iou"] if kind == "boxes" else []
    name, sep, rest = item.rpartition("=")
    if not sep:
        if kind != "classes":
            raise UsageError(
                f"--task-gate {item}: a {kind} result has several gates; name one: {', '.join(names)}=VALUE"
            )
        name = "top1"
    if name not in names:
        raise UsageError(
            f"--task-gate {item}: {name!r} is not a gate of a {kind} result; its gates: {', '.join(names)}"
        )
    number, _, percentile = rest.partition("@")
    try:
        value = float(number)
        tail = None if not percentile else float(percentile.removeprefix("p"))
    except ValueError:
        raise UsageError(f"--task-gate {item}: give NAME=VALUE or NAME=VALUE@pN, e.g. {names[0]}=0.9@p5") from None
    # NaN: every comparison with it is False, so an error-rate gate would never be judged;
    # infinity: an error rate under it always passes, a gate in name only.
    if not math.isfinite(value):
        raise UsageError(f"--task-gate {item}: the value must be a finite number; give e.g. {names[0]}=0.1")
    if tail is not None and (not 0 < tail < 100 or name in ("top1", "match_iou", "exact")):
        raise UsageError(f"--task-gate {item}: @pN names a percentile in (0, 100) of a per-file figure")
    return name, value, tail


def _share(item: object, value: float, want: str) -> float:
    if not 0 < value <= 1:
        raise UsageError(f"--task-gate {item}: must be {want}")
    return value


# -- the user's answers ----------------------------------------------------------------------------


def answer_of(kind: str, value: Any, said: str, name: str, labels: list[str] | None) -> dict[str, Any]:
    """The user's answer for one file in the shape ``postprocess`` gives for ``kind``."""
    key = {"boxes": "boxes", "mask": "mask", "ctc": "text", "embedding": "embedding"}[kind]
    if isinstance(value, Mapping) and key in value:
        value = value[key]
    try:
        if kind == "ctc" and isinstance(value, str):
            return {"text": value}
        if kind == "boxes" and isinstance(value, (list, tuple)):
            return {"boxes": [_box(b, labels) for b in value]}
        if kind == "mask" and not isinstance(value, (str, bytes, Mapping)):
            mask = np.asarray(value)
            if mask.ndim == 2 and mask.dtype.kind in "iub":
                return {"mask": mask}
        if kind == "embedding" and not isinstance(value, (str, bytes, Mapping)):
            vector = np.asarray(value, np.float64).reshape(-1)
            if vector.size and np.isfinite(vector).all():
                return {"embedding": vector}
    except (TypeError, ValueError, KeyError):
        pass
    raise UsageError(f"{said} {type(value).__name__} {str(value)[:60]!r} for {name}; expected {RETURNS[kind]}")


def _box(value: Mapping[str, Any], labels: list[str] | None) -> dict[str, Any]:
    """One box: its class index (by the bundle's labels where a label is given) and xyxy corners."""
    box = [float(v) for v in value["box"]]
    if len(box) != 4:
        raise ValueError("a box is [x1, y1, x2, y2]")
    if "index" in value:
        index = int(value["index"])
    elif labels is not None:
        index = labels.index(str(value["label"])) if str(value["label"]) in labels else -1
    else:
        index = int(value["label"])
    return {"index": index, "box": box}


# -- a variant's answers against the user's --------------------------------------------------------


def judge_task(
    kind: str, gates: TaskGates, files: Sequence[Path], results: Sequence[Mapping[str, Any]], expected: Sequence[Any]
) -> TaskAccuracy:
    """Every gate of ``kind`` read over the files' figures; the variant passes when all do."""
    per_file = [
        sample_figures(kind, ours, theirs, gates.match_iou) for ours, theirs in zip(results, expected, strict=True)
    ]
    readings = [read_figure(gate, [f[gate.name] for f in per_file]) for gate in gates.gates]
    figures = [_figure(r, files) for r in readings]
    tail_gates = [g for g in gates.gates if g.reads == "tail"]
    held = [all(_holds(g, f[g.name]) for g in tail_gates) for f in per_file]
    failed = [f for f in figures if not f.passed]
    note = (
        "task "
        + "; ".join(
            f"{f.name} {f.statistic} {f.value:.4f} (mean {f.mean:.4f}) vs gate {'≥' if f.higher_is_better else '≤'} {f.gate:g}"
            for f in figures
        )
        + f", {len(files)} files"
    )
    return TaskAccuracy(
        metric=kind,  # type: ignore[arg-type]
        figures=figures,
        agreement=round(float(np.mean(held)), 6),
        lower_bound=round(wilson_lower(sum(held), len(held)), 6),
        gate=1.0,
        samples=len(files),
        passed=not failed,
        verdict="fail" if failed else "pass",
        disagreements=_worst_files(kind, gates, per_file, files, failed),
        note=note,
    )


def _holds(gate: Gate, value: float | None) -> bool:
    return value is None or (value >= gate.threshold if gate.higher_is_better else value <= gate.threshold)


def _figure(reading: Any, files: Sequence[Path]) -> TaskFigure:
    gate = reading.gate
    return TaskFigure(
        name=gate.name,
        value=round(reading.value, 6),
        statistic=reading.statistic,
        mean=round(reading.mean, 6),
        gate=gate.threshold,
        higher_is_better=gate.higher_is_better,
        samples=reading.samples,
        worst=None if reading.worst is None else files[reading.worst].name,
        passed=reading.passed,
    )


def _worst_files(
    kind: str,
    gates: TaskGates,
    per_file: list[dict[str, float | None]],
    files: Sequence[Path],
    failed: list[TaskFigure],
) -> list[str]:
    """The files that miss each failed gate, worst first: ``name: recall 0.5000 (gate 0.9)``."""
    named: list[str] = []
    for figure in failed:
        gate = next(g for g in gates.gates if g.name == figure.name)
        missing = [(v, i) for i, f in enumerate(per_file) if (v := f[gate.name]) is not None and not _holds(gate, v)]
        missing.sort(reverse=not gate.higher_is_better)
        named += [f"{files[i].name}: {gate.name} {v:.4f} (gate {gate.threshold:g})" for v, i in missing[:SHOWN_WORST]]
    return named
