"""The pipeline's two entries: raw bytes → the model's input tensors, its outputs → the task result.

One implementation for both sides: the agent's ``/predict`` calls these per request and the
host calls them at conversion, so the bundle is validated with the very steps it will serve.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edgesdk.pipeline import audio, image, text
from edgesdk.pipeline.boxes import detections
from edgesdk.pipeline.detection import detection
from edgesdk.pipeline.draft import draft
from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.pipeline.geometry import ImageFrame, image_frame
from edgesdk.pipeline.orientation import oriented_size, read_orientation
from edgesdk.pipeline.post import argmax_mask, ctc_greedy, embedding, top_classes
from edgesdk.schemas.pipeline import Pipeline, PostProcess


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


@dataclass(frozen=True)
class Prepared:
    """The model's feeds for one input, and, for an image, where its pixels went (``frame``:
    what maps a detector's boxes back to the image that was sent)."""

    feeds: dict[str, np.ndarray]
    frame: ImageFrame | None = None


def preprocess(
    pipeline: Pipeline, data: bytes, media_type: str, inputs: Sequence[InputSpec], limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """The model's feeds (a batch of one) for ``data`` of ``media_type``, or PipelineInputError."""
    return prepare(pipeline, data, media_type, inputs, limits).feeds


def prepare(
    pipeline: Pipeline, data: bytes, media_type: str, inputs: Sequence[InputSpec], limits: Limits | None = None
) -> Prepared:
    """``preprocess``'s feeds with the image's frame (None for audio and text)."""
    limits = limits or Limits()
    if pipeline.input == "text":
        pre = pipeline.text
        tensors = text.tokenize(text.read_text(data, media_type, pre), pre)
        return Prepared(text.to_feeds(tensors, pre, {spec.name: np.dtype(spec.dtype) for spec in inputs}))
    first, fixed = _first_input(pipeline, inputs)
    if pipeline.input == "audio":
        pcm = audio.open_audio(data, media_type, pipeline.audio)
        limits.take(audio.decoded_nbytes(pcm, pipeline.audio), "the decoded audio")
        return Prepared({first.name: audio.to_tensor(pcm, pipeline.audio, np.dtype(first.dtype), _rank(first))} | fixed)
    picture = image.open_image(data, media_type, pipeline.image.max_pixels)
    turned = read_orientation(picture, pipeline.image)  # a phone's portrait photo, stored landscape
    frame = image_frame(*oriented_size(picture.width, picture.height, turned), pipeline.image)  # 422 before decoding
    decoding = draft(picture, pipeline.image, turned)  # a large JPEG decoded scaled, where the resize shrinks it anyway
    limits.take(image.decoded_nbytes(picture, pipeline.image, decoding), "the decoded image")
    normalize = "normalize" not in pipeline.folded  # else the graph does it (converters/graph_fold.py)
    tensor = image.to_tensor(picture, pipeline.image, np.dtype(first.dtype), normalize, decoding)
    return Prepared({first.name: tensor} | fixed, frame)


def _first_input(pipeline: Pipeline, inputs: Sequence[InputSpec]) -> tuple[InputSpec, dict[str, np.ndarray]]:
    """The input the decoded data feeds (the first) and the constant tensors of the others."""
    if not inputs:
        raise PipelineInputError(422, "the model has no inputs to feed")
    first, rest = inputs[0], inputs[1:]
    missing = [spec.name for spec in rest if spec.name not in pipeline.constants]
    if missing:
        raise PipelineInputError(
            422,
            f"the model also takes {missing}; an {pipeline.input} pipeline feeds the first input (give the others in constants)",
        )
    return first, {spec.name: constant(spec, pipeline.constants[spec.name]) for spec in rest}


def _rank(spec: InputSpec) -> int | None:
    shape = getattr(spec, "shape", None)
    return len(shape) if shape is not None else None


def constant(spec: InputSpec, value: float) -> np.ndarray:
    """A tensor of ``spec``'s shape (each dynamic axis 1) filled with ``value`` (a recurrent
    state's zeros, a sample-rate scalar)."""
    shape = tuple(dim if isinstance(dim, int) else 1 for dim in getattr(spec, "shape", ()))
    return np.full(shape, value, dtype=np.dtype(spec.dtype))


def output_name(pipeline: Pipeline, outputs: Mapping[str, np.ndarray]) -> str:
    """The output the post step reads: the one it names, else the model's first."""
    name = pipeline.post.output or next(iter(outputs), None)
    if name is None or name not in outputs:
        raise PipelineInputError(500, f"the pipeline reads output {name!r}; the model has {sorted(outputs)}")
    return name


def postprocess(
    pipeline: Pipeline,
    outputs: Mapping[str, np.ndarray],
    feeds: Mapping[str, np.ndarray] | None = None,
    frame: ImageFrame | None = None,
) -> dict[str, Any]:
    """The task result: ``{"labels": [...]}``, ``{"boxes": [...], "box_frame": {...}}``,
    ``{"text": ...}``, ``{"embedding": [...]}`` or ``{"mask": (H, W) uint8 array}`` (sent as
    PNG). ``feeds`` gives a mean-pooled embedding its attention mask; ``frame`` (``prepare``'s)
    maps boxes into the sent image's pixels, else they stay in the model input's."""
    post = pipeline.post
    output = outputs[output_name(pipeline, outputs)]
    if post.kind == "mask":
        return {"mask": argmax_mask(output, post)}
    if post.kind == "boxes":
        return boxes_result(output, post, frame)
    if post.kind == "detection":
        return detection(output, post)
    if post.kind == "ctc":
        return {"text": ctc_greedy(output, post)}
    if post.kind == "embedding":
        mask_name = pipeline.text.input_names.get("attention_mask", "attention_mask")
        mask = (feeds or {}).get(mask_name)
        return {"embedding": embedding(output, post, mask)}
    return {"labels": top_classes(output, post)}


def boxes_result(output: np.ndarray, post: PostProcess, frame: ImageFrame | None) -> dict[str, Any]:
    """The detections, and ``box_frame``: the pixels their coordinates are in."""
    found = detections(output, post)  # suppressed in the model input's pixels, as the model drew them
    if frame is None:
        return {"boxes": found, "box_frame": {"coordinates": "model_input_pixels", "format": "xyxy"}}
    if found:
        mapped = frame.to_image(np.array([box["box"] for box in found], dtype=np.float64)).tolist()
        found = [box | {"box": corners} for box, corners in zip(found, mapped, strict=True)]
    return {"boxes": found, "box_frame": frame.describe()}
