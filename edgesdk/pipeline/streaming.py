"""One request to a streaming model: its feeds split into calls, the calls' outputs stacked.

``audio.stream`` makes the first input's tensor ``(calls, 1, ...)``: one batch of one per call
(``audio.stream_chunks``). The agent runs the calls in order from the model's initial state
(``ModelServer.infer_stream``) and the post step reads each output stacked over the calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def split_calls(feeds: Mapping[str, np.ndarray], streamed: str) -> list[dict[str, np.ndarray]]:
    """One feeds dict per call: the ``streamed`` input's slice, the other inputs (constants) as they are."""
    return [{**feeds, streamed: chunk} for chunk in feeds[streamed]]


def stack_calls(outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each output over the calls, on a new leading axis."""
    return {name: np.stack([out[name] for out in outputs]) for name in outputs[0]} if outputs else {}
