"""Fold the pipeline's ``folded`` steps into one built variant and check that the fold changed
none of its outputs (graph_fold.py, fold_tflite.py, fold_openvino.py do the folding).

The check runs the variant before and after on the same decoded files: unfolded on the
pipeline's numpy normalization, folded on the pixels the agent will hand it. Its outputs may
move by float rounding only, or by no more than the variant itself moved from the source model
at its tensor gate (an int8 variant's requantized first op may round a value one step the other
way). A Core ML package cannot run here: its fold is checked on its spec (fold_coreml.py) and
it is not gated end to end, as before. A variant that cannot be folded (a full-integer input)
does not ship: the one pipeline of the bundle tells every variant's agent to skip the folded steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from edgesdk.converters.graph_fold import CASTS, FOLDERS, channel_shape, fold_artifact, fold_constants

from edgesdk.errors import ConversionError
from edgesdk.schemas.pipeline import Pipeline

#: Files the before/after check runs (each at batch 1): enough to see a wrong constant or layout.
CHECKED_FILES = 8
#: Float rounding a fold may add, relative to the output's magnitude.
ROUNDING = 1e-4


def fold_built(pipeline: Pipeline, built: Any, feeds: Sequence[Mapping[str, np.ndarray]] = ()) -> str | None:
    """Fold ``pipeline.folded`` into ``built`` (converters.pipeline._Built), checked on ``feeds``
    (the pipeline's feeds: pixels); None when it may ship, else the reason it may not."""
    if not pipeline.folded:
        return None
    fmt, precision = built.planned.format.value, built.planned.precision.value
    if fmt not in FOLDERS:
        return (
            f"{precision} dropped: the pipeline folds {pipeline.folded} into the graph, done for"
            f" {', '.join(FOLDERS)} variants ({fmt} is not folded here: convert with --formats {','.join(FOLDERS)})"
        )
    cast = "cast" in pipeline.folded and fmt in CASTS
    sample = list(feeds[:CHECKED_FILES]) if getattr(built, "validated", False) else []
    before = _outputs(built, [_normalized(pipeline, f) for f in sample])
    try:
        fold_artifact(built.artifact.files, pipeline.image, fmt, cast)
    except ConversionError as exc:
        return f"{precision} dropped: {exc}"
    if cast and getattr(built, "result", None) is not None:  # the manifest's input dtype says it takes uint8
        inputs = built.result.inputs
        inputs[0] = inputs[0].model_copy(update={"dtype": "uint8"})
    return _compare(built, before, _outputs(built, sample))


def _normalized(pipeline: Pipeline, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feed`` with its pixels (its first input: what the image fills) normalized in numpy, as
    the agent does for an unfolded variant."""
    pre, first = pipeline.image, next(iter(feed))
    a, b = fold_constants(pre, np.float32)
    shape = channel_shape(pre, a.size)
    pixels = np.asarray(feed[first], np.float32)
    return {**feed, first: pixels * a.reshape(shape) + b.reshape(shape)}


def _outputs(built: Any, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The variant's float outputs for each feed, in its runtime on this host."""
    if not feeds:
        return []
    from edgesdk.converters.quiet import quiet_native
    from edgesdk.converters.validate import _dequantize, _quantize, host_options

    from edgesdk.runtimes import load_variant

    runtime = built.planned.runtime.value
    blobs = {name: path.read_bytes() for name, path in built.artifact.files.items()}
    with quiet_native():
        model = load_variant(runtime, blobs, options=host_options(runtime, built.planned.options))
        try:
            ins, outs = {s.name: s for s in model.inputs}, {s.name: s for s in model.outputs}
            results = []
            for feed in feeds:
                raw = model.run({n: _quantize(np.asarray(v), ins[n]) if n in ins else v for n, v in feed.items()})
                results.append({n: np.asarray(_dequantize(v, outs.get(n)), np.float64) for n, v in raw.items()})
            return results
        finally:
            model.close()


def _compare(built: Any, before: list[dict[str, np.ndarray]], after: list[dict[str, np.ndarray]]) -> str | None:
    """The reason to drop the variant when its folded outputs moved further than allowed."""
    accuracy = built.result.accuracy if getattr(built, "result", None) is not None else None
    measured = accuracy.max_abs_diff if accuracy is not None else {}
    for old, new in zip(before, after, strict=True):
        for name, value in old.items():
            moved = float(np.max(np.abs(new[name] - value))) if value.size else 0.0
            allowed = max(ROUNDING * (1.0 + float(np.max(np.abs(value), initial=0.0))), measured.get(name, 0.0))
            if moved > allowed:
                return (
                    f"{built.planned.precision.value} dropped: folding moved output {name!r} by {moved:.3g}"
                    f" (allowed {allowed:.3g}: rounding, or the variant's own difference at its tensor gate)"
                )
    return None
