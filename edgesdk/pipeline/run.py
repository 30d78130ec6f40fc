"""The pipeline's two entries: raw bytes → the model's input tensors, its outputs → the task result.

One implementation for both sides: the agent's ``/predict`` calls these per request and the
host calls them at conversion, so the bundle is validated with the very steps it will serve.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.pipeline.image import decoded_nbytes, open_image, to_tensor
from edgesdk.pipeline.post import argmax_mask, top_classes
from edgesdk.schemas.pipeline import Pipeline


class InputSpec(Protocol):
    """One model input as the caller knows it: the agent's ``TensorSlot`` or the manifest's
    ``TensorSpec`` (with its public dtype: float32 where the tensor is quantized)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> Any: ...


#: ``charge(size, what)``: hold ``size`` bytes for ``what`` before they are allocated, or raise.
Charge = Callable[[int, str], None]


@dataclass(frozen=True)
class Limits:
    """What one request may cost beyond the pipeline's own signed bounds: ``charge`` is the
    agent's per-request memory allowance (``take_decoded``); None on the host."""

    charge: Charge | None = None

    def take(self, size: int, what: str) -> None:
        if self.charge is not None:
            self.charge(size, what)


def preprocess(
    pipeline: Pipeline, data: bytes, media_type: str, inputs: Sequence[InputSpec], limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """The model's feeds (a batch of one) for ``data`` of ``media_type``, or PipelineInputError."""
    limits = limits or Limits()
    if len(inputs) != 1:
        raise PipelineInputError(422, f"the model has {len(inputs)} inputs; an image pipeline feeds one")
    image = open_image(data, media_type, pipeline.image.max_pixels)
    limits.take(decoded_nbytes(image, pipeline.image), "the decoded image")
    slot = inputs[0]
    return {slot.name: to_tensor(image, pipeline.image, np.dtype(slot.dtype))}


def output_name(pipeline: Pipeline, outputs: Mapping[str, np.ndarray]) -> str:
    """The output the post step reads: the one it names, else the model's first."""
    name = pipeline.post.output or next(iter(outputs), None)
    if name is None or name not in outputs:
        raise PipelineInputError(500, f"the pipeline reads output {name!r}; the model has {sorted(outputs)}")
    return name


def postprocess(pipeline: Pipeline, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The task result: ``{"labels": [...]}`` or ``{"mask": (H, W) uint8 array}`` (sent as PNG)."""
    post = pipeline.post
    output = outputs[output_name(pipeline, outputs)]
    if post.kind == "mask":
        return {"mask": argmax_mask(output, post)}
    return {"labels": top_classes(output, post)}
