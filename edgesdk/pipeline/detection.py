"""A streaming detector's calls → one answer: was the keyword (or event) in the audio?

A streaming model (``audio.stream``) is called once per chunk of feature frames and answers a
probability each time. As pymicro-wakeword's detector does, the answer is the mean of
``average`` consecutive calls' probabilities (0 until that many have run), and the audio holds
a detection when one such mean exceeds ``threshold``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import PostProcess


def detection(output: np.ndarray, post: PostProcess) -> dict[str, Any]:
    """``{"detected", "probability", "calls"}`` from ``output`` stacked over the calls (axis 0)."""
    calls = output.shape[0] if output.ndim else 0
    if calls == 0 or output.size != calls:
        raise PipelineInputError(
            500, f"a detection reads one probability per call; the model answered {list(output.shape)}"
        )
    probabilities = output.reshape(calls).astype(np.float64)
    if calls < post.average:
        best = 0.0  # the detector has not filled its window yet
    else:
        window = np.lib.stride_tricks.sliding_window_view(probabilities, post.average)
        best = float(window.mean(axis=1).max())
    threshold = post.threshold if post.threshold is not None else 0.5
    return {"detected": best > threshold, "probability": best, "calls": calls}
