"""Pipeline: the pre- and post-processing that turns raw bytes into a model's tensors and its
outputs into a task result, declared in the signed manifest (``BundleManifest.pipeline``).

Shared by the host (``edgesdk package --pipeline``) and the device (``agent/pipeline/``), so
both read one schema. Declarative, like TFLite Metadata's ImageProperties or MediaPipe Tasks'
options: the agent runs a fixed, documented order of steps, never code from the bundle.

Image steps, always in this order (each optional): decode (JPEG/PNG) → colour (RGB, BGR or L)
→ resize → center crop → ``x * scale`` → ``(x - mean) / std`` per channel → layout → the model
input's dtype (quantized with the input's own scale/zero point when it is int8/uint8).
Post steps: activation (softmax/sigmoid) → top-k with labels and a threshold, or an argmax mask.

Not yet (refused here with one line): audio and text inputs, box decoding/NMS, CTC decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from edgesdk.schemas.base import Schema

#: Largest image side and pixel count a pipeline may allow (a signed bound, checked on the
#: image's declared size before anything is decoded).
MAX_SIDE = 16384
MAX_PIXELS_CAP = 100_000_000
DEFAULT_MAX_PIXELS = 16_000_000
MAX_LABELS = 100_000

Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]

_NOT_YET_INPUTS = {"audio", "wav", "pcm", "text", "tokens"}
_NOT_YET_POST = {"boxes", "nms", "detections", "ctc", "text"}


def _not_yet(kind: str, value: object, supported: str) -> ValueError:
    return ValueError(
        f"{kind} {value!r} is not supported yet (supported: {supported}); see docs/bundle-format.md, 'Pipeline'"
    )


class Resize(Schema):
    """Resize to ``height`` × ``width`` with a named interpolation (Pillow's filters)."""

    height: Side
    width: Side
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"


class CenterCrop(Schema):
    """Cut the central ``height`` × ``width`` (after the resize); larger than the image is refused per request."""

    height: Side
    width: Side


class ImagePre(Schema):
    """Decode an image and make the model's input tensor from it."""

    color: Literal["RGB", "BGR", "L"] = "RGB"
    resize: Resize | None = None
    center_crop: CenterCrop | None = None
    scale: float = Field(1.0, gt=0, description="pixels (0..255) are multiplied by this first, e.g. 1/255")
    mean: list[float] = Field(default_factory=lambda: [0.0], min_length=1, max_length=3)
    std: list[float] = Field(default_factory=lambda: [1.0], min_length=1, max_length=3)
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    max_pixels: int = Field(
        DEFAULT_MAX_PIXELS,
        ge=1,
        le=MAX_PIXELS_CAP,
        description="images declaring more pixels are refused before decoding (decompression bombs)",
    )

    @field_validator("std")
    @classmethod
    def _nonzero(cls, std: list[float]) -> list[float]:
        if any(s == 0 for s in std):
            raise ValueError(f"std {std} has a 0: every channel's std must be non-zero")
        return std

    @model_validator(mode="after")
    def _per_channel(self) -> ImagePre:
        channels = 1 if self.color == "L" else 3
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ValueError(f"{name} has {len(values)} values; color {self.color} needs 1 or {channels}")
        return self


class PostProcess(Schema):
    """Turn one model output into the task result: labels and scores, or a class mask."""

    kind: Literal["classes", "mask"] = "classes"
    output: str | None = Field(None, description="the model output to read (default: the first)")
    activation: Literal["none", "softmax", "sigmoid"] = "none"
    top_k: int = Field(5, ge=1, le=1000)
    threshold: float | None = Field(None, description="drop classes scoring below this (after the activation)")
    labels: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None, max_length=MAX_LABELS, description="class names by index (the labels file packaged with the bundle)"
    )
    mask_layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="where the class axis is in a mask output")

    @field_validator("kind", mode="before")
    @classmethod
    def _kind_known(cls, kind: object) -> object:
        if isinstance(kind, str) and kind in _NOT_YET_POST:
            raise _not_yet("post kind", kind, "classes, mask")
        return kind


class Pipeline(Schema):
    """The whole pipeline: one input decoder, its steps, one post-processing."""

    input: Literal["image"] = "image"
    image: ImagePre = Field(default_factory=ImagePre)
    post: PostProcess = Field(default_factory=PostProcess)

    @field_validator("input", mode="before")
    @classmethod
    def _input_known(cls, value: object) -> object:
        if isinstance(value, str) and value in _NOT_YET_INPUTS:
            raise _not_yet("input", value, "image")
        return value


def load_pipeline(path: str | Path, labels: str | Path | None = None) -> Pipeline:
    """Read a pipeline file (YAML or JSON) and, if given, a labels file (one label a line)
    into ``post.labels``; any problem is one ``SchemaError``/``UsageError`` line naming the file."""
    import yaml

    from edgesdk.errors import UsageError

    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--pipeline {source}: cannot read it ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"--pipeline {source}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(
            f"--pipeline {source}: must be a mapping with input, image and post, got {type(data).__name__}"
        )
    if labels is not None:
        post = data.setdefault("post", {})
        if not isinstance(post, dict):
            raise UsageError(f"--pipeline {source}: field 'post' must be a mapping")
        post["labels"] = read_labels(Path(labels))
    return Pipeline.parse_obj_clear(data, source=str(source))


def read_labels(path: Path) -> list[str]:
    """A labels file: one class name a line, by class index (blank lines at the end ignored)."""
    from edgesdk.errors import UsageError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--labels {path}: cannot read it as UTF-8 text ({exc})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"--labels {path}: no labels in it (one class name a line)")
    return [line.strip() for line in lines]
