"""The end-to-end gate: each variant answers the user's own raw files through the bundle's
pipeline (decode → pre → model → post, ``edgesdk.pipeline``: the very code ``/predict`` runs),
in its runtime on this host, and must give the task results the user's current code gives:
the labels (below), or boxes, a mask, text or an embedding (``task_results.py``: each kind's
figures read on their worst file, the mean beside it).

Tensor gates compare a variant with the source model on tensors someone already made; they
cannot see a pipeline that normalizes differently from the user's code, or a label file off by
one. Here the reference is the user's: a JSON of expected labels, or their Python function
(``--reference mypkg.mymod:predict`` or ``my_preprocess.py:predict``), run once per file on
this host (it is the user's own code, imported and called as they would). The figure is the
share of files whose top-1 label agrees, read on its 95 % Wilson bound like a tensor top-1
gate; where the user's function also gives scores, the score of the agreed label is judged on
its tail (the worst file, or the 95th percentile from 20 files) against a tolerance.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.task_results import TaskGates, answer_of, judge_task, parse_task_gates

from edgesdk.errors import ConversionError, UsageError
from edgesdk.pipeline import PipelineInputError, compare_results, postprocess, preprocess
from edgesdk.pipeline.compare import DEFAULT_GATES
from edgesdk.quality.tail_statistics import agreement_reading, tail_reading
from edgesdk.schemas.manifest import TensorSpec
from edgesdk.schemas.pipeline import Pipeline
from edgesdk.schemas.report import EndToEndCheck, TaskAccuracy, TaskFigure

#: File suffix → the media type the agent is sent for it, per pipeline input (a .txt file's
#: text goes as the JSON body ``/predict`` takes).
MEDIA_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".wav": "audio/wav", ".txt": "text"}
SUFFIXES = {"image": (".jpg", ".jpeg", ".png"), "audio": (".wav",), "text": (".txt",)}
DEFAULT_TASK_GATE = 0.99
DEFAULT_SCORE_TOLERANCE = 0.05
#: Disagreements named in the report (the first ones, by file name).
SHOWN_DISAGREEMENTS = 5

RETURNS = "a label (str or int), (label, score), {'label': ..., 'score': ...}, a list of those, or {'labels': [...]}"


@dataclass(frozen=True)
class Expected:
    """The user's answer for one file: its top-1 label and, when given, that label's score."""

    label: str
    score: float | None = None


@dataclass(frozen=True)
class TaskCheck:
    """Everything the gate needs, read and computed once before any variant is built."""

    pipeline: Pipeline
    files: list[Path]
    expected: list[Any]  # Expected (classes), else the user's answer as postprocess gives it
    summary: EndToEndCheck
    gate: float = DEFAULT_TASK_GATE
    score_tolerance: float = DEFAULT_SCORE_TOLERANCE
    gates: TaskGates | None = None  # boxes, mask, ctc, embedding: their gates

    @property
    def kind(self) -> str:
        return self.pipeline.post.kind


def pipeline_sha256(pipeline: Pipeline) -> str:
    """The identity of a pipeline (labels included): what was validated is what gets signed.
    Defaults left out, so a later SDK's new optional steps do not change an old pipeline's identity."""
    return hashlib.sha256(pipeline.model_dump_json(exclude_defaults=True).encode("utf-8")).hexdigest()


def prepare_task_check(
    pipeline: Pipeline,
    images: Path,
    reference: str,
    gate: float | str | Sequence[str] | None = None,
    score_tolerance: float = DEFAULT_SCORE_TOLERANCE,
) -> TaskCheck:
    """Read the folder of raw files and the user's answer for each (their JSON or function).
    ``gate``: the top-1 share for classes, or ``NAME=VALUE[@pN]`` items (task_results.py)."""
    kind = pipeline.post.kind
    if kind != "classes" and kind not in DEFAULT_GATES:
        gated = ", ".join(["classes", *DEFAULT_GATES])
        raise UsageError(f"--reference: a {kind!r} post is not gated end to end yet (gated: {gated})")
    gates = parse_task_gates(kind, gate)
    files = list_images(images, pipeline.input)
    expected = expected_results(reference, files, kind, pipeline.post.labels)
    scored = kind == "classes" and any(e.score is not None for e in expected)
    summary = EndToEndCheck(
        images=str(images),
        files=len(files),
        reference=reference,
        pipeline_sha256=pipeline_sha256(pipeline),
        gate=gates.top1 if kind == "classes" else 1.0,
        score_tolerance=score_tolerance if scored else None,
        kind=kind,
        gates=gates.thresholds(kind),
    )
    return TaskCheck(
        pipeline, files, expected, summary, gates.top1, score_tolerance, None if kind == "classes" else gates
    )


def list_images(folder: Path, input_kind: str = "image") -> list[Path]:
    """The raw files of ``folder`` (not its subfolders) the pipeline's input takes, by name:
    JPEG/PNG images, WAV audio or .txt texts."""
    suffixes = SUFFIXES[input_kind]
    shown = ", ".join(suffixes)
    if not folder.is_dir():
        raise UsageError(f"--validation-images {folder}: not a folder; give a folder of {shown} files")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        raise UsageError(f"--validation-images {folder}: no {shown} file in it (an {input_kind} pipeline)")
    return files


# -- the user's reference ------------------------------------------------------------------------


def expected_results(
    reference: str, files: Sequence[Path], kind: str = "classes", labels: list[str] | None = None
) -> list[Any]:
    """The user's answer per file, from ``FILE.json`` or by calling their function on each file."""

    def read(value: Any, said: str, name: str) -> Any:
        return normalize(value, said, name) if kind == "classes" else answer_of(kind, value, said, name, labels)

    if reference.endswith(".json"):
        return _from_json(reference, files, read)
    function = load_reference(reference)
    takes_bytes = _takes_bytes(function)
    answers = []
    for path in files:
        try:
            value = function(path.read_bytes() if takes_bytes else str(path))
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure is theirs to read, in one line
            raise UsageError(f"--reference {reference} raised on {path.name}: {type(exc).__name__}: {exc}") from None
        answers.append(read(value, f"--reference {reference} returned", path.name))
    return answers


def load_reference(spec: str) -> Callable[[Any], Any]:
    """``package.module:function`` (importable from the current folder) or ``file.py:function``."""
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute:
        raise UsageError(f"--reference {spec!r}: give MODULE:FUNCTION, FILE.py:FUNCTION or a FILE.json of labels")
    try:
        module = _import_file(Path(where)) if where.endswith(".py") else _import_module(where)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - an import runs the user's module: whatever it raises is one line
        raise UsageError(f"--reference {spec}: cannot import {where} ({type(exc).__name__}: {exc})") from None
    function = getattr(module, attribute, None)
    if function is None:
        raise UsageError(f"--reference {spec}: {where} has no {attribute!r}")
    if not callable(function):
        raise UsageError(f"--reference {spec}: {attribute!r} is a {type(function).__name__}, not a function")
    return function  # type: ignore[no-any-return]


def _import_module(name: str) -> Any:
    """As ``python -c 'import name'`` would from here: the current folder is searched first."""
    here = str(Path.cwd())
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            sys.path.remove(here)


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise UsageError(f"--reference {path}: no such file; give FILE.py:FUNCTION")
    spec = importlib.util.spec_from_file_location(f"edgesdk_reference_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--reference {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _takes_bytes(function: Callable[[Any], Any]) -> bool:
    """A function whose first parameter is annotated ``bytes`` gets the raw bytes, others the path."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(parameters) and parameters[0].annotation in (bytes, "bytes")


def _from_json(reference: str, files: Sequence[Path], read: Callable[[Any, str, str], Any]) -> list[Any]:
    try:
        table = json.loads(Path(reference).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--reference {reference}: cannot read it as JSON ({exc})") from None
    if not isinstance(table, dict):
        raise UsageError(f"--reference {reference}: must map each file name to its label")
    missing = [p.name for p in files if p.name not in table]
    if missing:
        raise UsageError(f"--reference {reference}: no label for {missing[0]} ({len(missing)} file(s) missing)")
    return [read(table[p.name], f"--reference {reference} gives", p.name) for p in files]


def normalize(value: Any, said: str, name: str) -> Expected:
    """One answer in any of the usual shapes → its top-1 label (and score)."""
    if isinstance(value, Mapping) and "labels" in value:
        value = value["labels"]
    if isinstance(value, (list, tuple)) and value and not _is_pair(value):
        candidates = [normalize(v, said, name) for v in value]
        if all(c.score is not None for c in candidates):
            return max(candidates, key=lambda c: c.score or 0.0)
        return candidates[0]
    if isinstance(value, Mapping) and "label" in value:
        return Expected(str(value["label"]), _score(value.get("score"), said, name))
    if _is_pair(value):
        return Expected(str(value[0]), _score(value[1], said, name))
    if isinstance(value, (str, int, np.integer)) and not isinstance(value, bool):
        return Expected(str(value))
    raise UsageError(f"{said} {type(value).__name__} {str(value)[:60]!r} for {name}; expected {RETURNS}")


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], (str, int))
        and isinstance(value[1], (float, int, np.floating))
    )


def _score(value: Any, said: str, name: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{said} score {value!r} for {name}; a score is a number") from None


# -- a variant through the pipeline ----------------------------------------------------------------


def pipeline_feeds(check: TaskCheck, source_inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """Every file decoded and pre-processed once (the same for every variant): the model's feeds,
    for ``source_inputs``, the float inputs the pipeline fills."""
    feeds = []
    for path in check.files:
        data, media_type = path.read_bytes(), MEDIA_TYPES[path.suffix.lower()]
        if media_type == "text":  # the body /predict takes for a text pipeline
            data, media_type = json.dumps({"text": data.decode("utf-8", "replace")}).encode(), "application/json"
        try:
            feeds.append(preprocess(check.pipeline, data, media_type, source_inputs))
        except PipelineInputError as exc:
            raise UsageError(f"--validation-images: {path.name} cannot go through the pipeline: {exc}") from None
    return feeds


def run_variant(check: TaskCheck, model: Any, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
    """Every file's feeds through ``model`` (a loaded variant: ``run(feeds)``) and the pipeline's
    post step, as ``/predict`` answers it."""
    from edgesdk.converters.validate import _dequantize, _quantize

    in_specs = {s.name: s for s in model.inputs}
    out_specs = {s.name: s for s in model.outputs}
    results = []
    for feed in feeds:
        raw = model.run({n: _quantize(v, in_specs[n]) if n in in_specs else v for n, v in feed.items()})
        outputs = {n: _dequantize(v, out_specs.get(n)) for n, v in raw.items()}
        try:
            results.append(postprocess(check.pipeline, outputs, feed))
        except PipelineInputError as exc:
            raise ConversionError(f"the pipeline cannot read this variant's output: {exc}") from None
    return results


def judge(check: TaskCheck, results: Sequence[Mapping[str, Any]]) -> TaskAccuracy:
    """The variant's answers against the user's: label agreement (Wilson bound) and the score
    tail; for boxes, masks, text and embeddings each gate of the kind (task_results.py)."""
    if check.gates is not None:
        return judge_task(check.kind, check.gates, check.files, results, check.expected)
    labels = check.pipeline.post.labels
    agree, differences, missed = [], [], []
    for path, ours, theirs in zip(check.files, results, check.expected, strict=True):
        same = compare_results("classes", ours, {"labels": [_as_class(theirs, labels)]})
        agree.append(same)
        top = ours["labels"][0] if ours["labels"] else None
        if not same:
            missed.append(f"{path.name}: {top['label'] if top else 'no label'} (yours {theirs.label})")
        elif theirs.score is not None and top is not None:
            differences.append(abs(float(top["score"]) - theirs.score))
    reading = agreement_reading(np.asarray(agree), check.gate)
    scores = tail_reading(np.asarray(differences), check.score_tolerance, lower_is_better=True) if differences else None
    failed = reading.verdict == "fail" or (scores is not None and scores.verdict == "fail")
    verdict = (
        "fail"
        if failed
        else "inconclusive"
        if "inconclusive" in (reading.verdict, getattr(scores, "verdict", ""))
        else "pass"
    )
    note = f"task top-1 label agreement {reading.value:.2%} (95% bound {reading.lower_bound:.2%}) vs gate {check.gate:.0%}, {reading.samples} files"
    if scores is not None:
        note += f"; |score - yours| {scores.statistic} {scores.value:.4f} (mean {scores.mean:.4f}) vs tolerance {check.score_tolerance:g}"
    if reading.verdict == "inconclusive":
        note += f"; inconclusive, ships: {reading.samples_needed} files would tell"  # the bound alone reads as a miss
    figures = [
        TaskFigure(
            name="top1", value=round(reading.value, 6), statistic=f"share of files (95% bound {reading.lower_bound:.4f})",
            mean=round(reading.value, 6), gate=check.gate, samples=reading.samples, passed=reading.verdict != "fail",
        )
    ]  # fmt: skip
    if scores is not None:
        figures.append(
            TaskFigure(
                name="score_diff", value=round(scores.value, 6), statistic=scores.statistic, mean=round(scores.mean, 6),
                gate=check.score_tolerance, higher_is_better=False, samples=scores.samples,
                passed=scores.verdict != "fail",
            )
        )  # fmt: skip
    return TaskAccuracy(
        figures=figures,
        agreement=round(reading.value, 6),
        lower_bound=round(reading.lower_bound or 0.0, 6),
        gate=check.gate,
        samples=reading.samples,
        samples_needed=reading.samples_needed if reading.verdict == "inconclusive" else None,
        score_diff=None if scores is None else round(scores.value, 6),
        score_diff_mean=None if scores is None else round(scores.mean, 6),
        score_statistic=None if scores is None else scores.statistic,
        score_tolerance=None if scores is None else check.score_tolerance,
        passed=not failed,
        verdict=verdict,
        disagreements=missed[:SHOWN_DISAGREEMENTS],
        note=note,
    )


def _as_class(expected: Expected, labels: list[str] | None) -> dict[str, Any]:
    """The user's label as a ``postprocess`` class (its index by the bundle's labels file)."""
    if labels is not None:
        index = labels.index(expected.label) if expected.label in labels else -1
    else:
        index = int(expected.label) if expected.label.lstrip("-").isdigit() else -1
    return {"label": expected.label, "index": index, "score": expected.score}


def gate_variants(
    check: TaskCheck,
    built: Sequence[Any],
    source_inputs: Sequence[TensorSpec],
    reject: Callable[[Any, str], None],
    decide: Callable[[str], None],
) -> list[Any]:
    """Keep the built variants (``converters.pipeline._Built``) whose task results agree with the
    user's; ``reject(built, reason)`` the others, as a missed tensor gate is rejected."""
    from edgesdk.converters.quiet import quiet_native
    from edgesdk.converters.validate import host_options

    from edgesdk.runtimes import load_variant

    feeds = pipeline_feeds(check, source_inputs)
    kept = []
    for b in built:
        unfolded = fold_steps(check.pipeline, b, feeds)
        if unfolded is not None:
            reject(b, unfolded)
            continue
        if not b.validated:  # could not run on this host (Core ML on Linux): neither can its pipeline
            decide(f"{b.planned.id}: not gated end to end (it cannot run on this host)")
            kept.append(b)
            continue
        runtime = b.planned.runtime.value
        blobs = {name: path.read_bytes() for name, path in b.artifact.files.items()}
        with quiet_native():
            model = load_variant(runtime, blobs, options=host_options(runtime, b.planned.options))
            try:
                b.task = judge(check, run_variant(check, model, feeds))
            finally:
                model.close()
        if b.task.passed:
            decide(f"{b.planned.id}: {b.task.note}")
            kept.append(b)
        else:
            shown = "; ".join(b.task.disagreements[:3])
            reject(
                b, f"{b.planned.precision.value} dropped end to end: {b.task.note}" + (f" ({shown})" if shown else "")
            )
    return kept


def fold_steps(pipeline: Pipeline, built: Any, feeds: Sequence[Mapping[str, np.ndarray]] = ()) -> str | None:
    """Fold the pipeline's ``folded`` steps into this variant's graph, checked on ``feeds``,
    before it is gated end to end (fold_variant.py); the reason it cannot ship, if so."""
    from edgesdk.converters.fold_variant import fold_built

    return fold_built(pipeline, built, feeds)
