"""A variant of a bundle whose pipeline folds steps into the graph must take what the agent
will hand it: pixels (0..255), as float, or as uint8 where the cast is folded too
(``folded: [normalize, cast]``: the variant's manifest input dtype says uint8, or float32 for a
Core ML variant, whose graph cannot take uint8; converters/fold_variant.py). Checked on the loaded model, the
runtime's own input, before the variant is served: a graph without the fold would read raw
pixels as a normalized tensor, and a float graph would get uint8 it was never validated on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgesdk.errors import AgentError
from edgesdk.schemas.manifest import Variant
from edgesdk.schemas.pipeline import Pipeline


def check_folded_input(pipeline: Pipeline | None, meta: Variant, loaded: Any) -> None:
    """AgentError (``loaded`` closed) when its first input is not the dtype ``pipeline.folded`` needs."""
    if pipeline is None or not pipeline.folded or pipeline.input != "image":
        return
    first = (getattr(loaded, "inputs", None) or meta.inputs)[0]
    dtype, declared = np.dtype(first.dtype), np.dtype(meta.inputs[0].dtype)
    quantized = first.quantization is not None or meta.inputs[0].quantization is not None
    cast = "cast" in pipeline.folded
    if cast and (dtype != declared or not (dtype == np.uint8 or dtype.kind == "f") or quantized):
        # uint8 where the runtime's graph casts; a Core ML variant declares its float32 input.
        problem = f"takes {dtype} (manifest: {declared}), not the uint8 or float pixels a folded cast bundle declares"
    elif not cast and dtype.kind != "f":
        problem = f"takes {dtype}, not the float pixels a folded normalization takes"
    else:
        return
    loaded.close()
    raise AgentError(
        f"variant {meta.id} input {first.name!r} {problem} (pipeline folded: {pipeline.folded}); not served:"
        " repackage the model from a conversion with this pipeline"
    )
