"""Pipeline: the pre- and post-processing that turns raw bytes into a model's tensors and its
outputs into a task result, declared in the signed manifest (``BundleManifest.pipeline``).

Shared by the host (``edgesdk package --pipeline``) and the device, which both run the steps
of ``edgesdk/pipeline/``, so
both read one schema. Declarative, like TFLite Metadata's ImageProperties or MediaPipe Tasks'
options: the agent runs a fixed, documented order of steps, never code from the bundle.

Image steps, always in this order (each optional): decode (JPEG/PNG) → colour (RGB, BGR or L)
→ turned upright as its EXIF orientation says → resize → center crop → ``x * scale`` → ``(x - mean) / std`` per channel → layout → the model
input's dtype (quantized with the input's own scale/zero point when it is int8/uint8).
Audio steps, in this order: decode (WAV: PCM 16/32-bit or float32; or raw 16-bit PCM at a
declared rate) → mono downmix → resample → pad/trim → framing + window, or log-mel.
Text: ``{"text": ...}`` → a ``tokenizer.json`` → input_ids, attention_mask, token_type_ids.
Post steps: activation (softmax/sigmoid) → top-k with labels and a threshold; an argmax mask;
box decoding with class-aware NMS; greedy CTC with a vocabulary; a pooled, normalised embedding.
``folded: [normalize]``: the ``x * scale`` and ``(x - mean) / std`` steps are in the model's graph
(converters/graph_fold.py), so the agent skips them; ``folded: [normalize, cast]``: the graph
also casts uint8 pixels to float, so the agent hands the decoder's uint8 as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgesdk.schemas.base import Schema

#: Largest image side and pixel count a pipeline may allow (a signed bound, checked on the
#: image's declared size before anything is decoded).
MAX_SIDE = 16384
MAX_PIXELS_CAP = 100_000_000
DEFAULT_MAX_PIXELS = 16_000_000
MAX_LABELS = 100_000

Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]


class _Finite(Schema):
    """A pipeline's numbers are finite: YAML's ``.nan`` or ``.inf`` passes ``gt``/``ge`` bounds (or
    none) and would be refused only when the manifest is written, naming the bundle, not the field."""

    model_config = ConfigDict(allow_inf_nan=False)


class Letterbox(_Finite):
    """Keep the aspect ratio: scale the image to fit, centre it, pad the rest with ``fill``."""

    fill: int = Field(114, ge=0, le=255, description="the padding's grey level (Ultralytics: 114)")


class Resize(_Finite):
    """Resize to ``height`` × ``width`` with a named interpolation (Pillow's filters), stretched,
    or fitted inside it with ``letterbox`` (edgesdk/pipeline/geometry.py)."""

    height: Side
    width: Side
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"
    letterbox: Letterbox | None = None
    draft: bool | None = Field(
        None,
        description="false: decode every pixel of a JPEG; else one much larger than this size is decoded at 1/2,"
        " 1/4 or 1/8 scale where the interpolation filters (edgesdk/pipeline/draft.py)",
    )


class CenterCrop(_Finite):
    """Cut the central ``height`` × ``width`` (after the resize); larger than the image is refused per request."""

    height: Side
    width: Side


class ImagePre(_Finite):
    """Decode an image and make the model's input tensor from it."""

    color: Literal["RGB", "BGR", "L"] = "RGB"
    resize: Resize | None = None
    center_crop: CenterCrop | None = None
    scale: float = Field(1.0, gt=0, description="pixels (0..255) are multiplied by this first, e.g. 1/255")
    mean: list[float] = Field(default_factory=lambda: [0.0], min_length=1, max_length=3)
    std: list[float] = Field(default_factory=lambda: [1.0], min_length=1, max_length=3)
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    exif_orientation: bool | None = Field(
        None,
        description="false: feed the image as stored; else its EXIF Orientation (1-8) turns it upright after"
        " decoding, before the steps, as PIL.ImageOps.exif_transpose does (edgesdk/pipeline/orientation.py)",
    )
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
        crop, size = self.center_crop, self.resize
        if crop is not None and size is not None and (crop.height > size.height or crop.width > size.width):
            raise ValueError(  # every image would be a 422 at /predict
                f"center_crop {crop.height}x{crop.width} is larger than the resize's {size.height}x{size.width}"
            )
        return self


#: Largest audio a pipeline may allow, in PCM bytes (frames × channels × sample width), and
#: the default: both checked on the WAV header's declared size before a sample is read.
MAX_AUDIO_BYTES_CAP = 256 * 1024 * 1024
DEFAULT_MAX_AUDIO_BYTES = 16 * 1024 * 1024
#: A tokenizer.json rides in the signed manifest (≤ 1 MiB in all, edgesdk/bundle/container.py).
MAX_TOKENIZER_CHARS = 900_000


class RawPcm(_Finite):
    """What ``audio/pcm`` bodies are: little-endian 16-bit samples at this declared rate."""

    rate: int = Field(ge=1000, le=384_000)
    channels: int = Field(1, ge=1, le=16)


class Framing(_Finite):
    """Cut the waveform into ``length``-sample frames every ``hop`` samples, each windowed."""

    length: int = Field(ge=1, le=1_048_576)
    hop: int = Field(ge=1, le=1_048_576)
    window: Literal["none", "hann", "hamming"] = "none"


class LogMel(_Finite):
    """Log-mel spectrogram: a periodic-Hann STFT of ``n_fft`` samples every ``hop``, power 2,
    triangular filters on the HTK mel scale (not area-normalised), ``ln(mel + log_offset)``.
    Frames are not padded (no ``center``): ``1 + (samples - n_fft) // hop`` of them."""

    n_fft: int = Field(400, ge=16, le=16384)
    hop: int = Field(160, ge=1, le=16384)
    n_mels: int = Field(80, ge=1, le=512)
    fmin: float = Field(0.0, ge=0)
    fmax: float | None = Field(None, gt=0, description="default: half the sample rate")
    log_offset: float = Field(1e-6, gt=0)
    layout: Literal["frames_mels", "mels_frames"] = "frames_mels"

    @model_validator(mode="after")
    def _band(self) -> LogMel:
        if self.fmax is not None and self.fmax <= self.fmin:
            raise ValueError(f"fmax {self.fmax} must be above fmin {self.fmin}")
        return self


class MicroFrontend(_Finite):
    """TFLite-Micro's audio frontend, as microWakeWord's spotters take it (defaults: theirs):
    a Hann window of ``window_ms`` every ``step_ms``, a 16-bit fixed-point FFT, ``channels``
    mel bands from ``lower_hz`` to ``upper_hz``, noise reduction, PCAN gain control, an integer
    log; features are the uint16 values × ``output_scale`` (edgesdk/pipeline/micro_frontend.py).
    Takes 16-bit samples: float WAVs are rounded to them."""

    window_ms: int = Field(30, ge=1, le=1000)
    step_ms: int = Field(10, ge=1, le=1000)
    channels: int = Field(40, ge=1, le=256)
    lower_hz: float = Field(125.0, ge=0)
    upper_hz: float = Field(7500.0, gt=0)
    smoothing_bits: int = Field(10, ge=0, le=16)
    even_smoothing: float = Field(0.025, ge=0, le=1)
    odd_smoothing: float = Field(0.06, ge=0, le=1)
    min_signal_remaining: float = Field(0.05, ge=0, le=1)
    pcan: bool = True
    pcan_strength: float = Field(0.95, ge=0, le=4)
    pcan_offset: float = Field(80.0, gt=0)
    gain_bits: int = Field(21, ge=0, le=30)
    log: bool = True
    scale_shift: int = Field(6, ge=0, le=16)
    output_scale: float = Field(
        0.0390625, gt=0, description="features = the uint16 values × this (pymicro-features: 1/25.6)"
    )

    @model_validator(mode="after")
    def _band(self) -> MicroFrontend:
        if self.upper_hz <= self.lower_hz:
            raise ValueError(f"upper_hz {self.upper_hz} must be above lower_hz {self.lower_hz}")
        if self.step_ms > self.window_ms:
            raise ValueError(f"step_ms {self.step_ms} is longer than window_ms {self.window_ms}")
        return self


class Streaming(_Finite):
    """Run a streaming (stateful) model over the features: ``frames`` feature frames per call,
    its state reset at each request's start and carried between its calls; the calls' outputs
    are stacked for the post step (``kind: detection``)."""

    frames: int = Field(ge=1, le=4096, description="feature frames per call (okay_nabu: 3)")
    max_calls: int = Field(6000, ge=1, le=100_000, description="longer audio is refused (413)")


class AudioPre(_Finite):
    """Decode WAV (PCM 16/32-bit, float32) or raw PCM and make the model's input from it:
    downmix to mono → resample → pad/trim → framing or log-mel (or the waveform as it is)."""

    sample_rate: int = Field(16000, ge=1000, le=384_000, description="the rate the model takes")
    pcm: RawPcm | None = Field(None, description="accept audio/pcm bodies, declared so")
    length: int | None = Field(None, ge=1, le=100_000_000, description="pad with zeros or trim to this many samples")
    framing: Framing | None = None
    log_mel: LogMel | None = None
    micro_frontend: MicroFrontend | None = None
    stream: Streaming | None = None
    max_bytes: int = Field(
        DEFAULT_MAX_AUDIO_BYTES,
        ge=1,
        le=MAX_AUDIO_BYTES_CAP,
        description="audio declaring more PCM bytes (frames × channels × width) is refused before reading",
    )

    @model_validator(mode="after")
    def _one_feature(self) -> AudioPre:
        features = [name for name in ("framing", "log_mel", "micro_frontend") if getattr(self, name) is not None]
        if len(features) > 1:
            raise ValueError(f"{' and '.join(features)} are ways to frame the waveform: name one")
        if self.stream is not None and self.micro_frontend is None and self.log_mel is None:
            raise ValueError("stream runs the model over feature frames: name log_mel or micro_frontend")
        if self.log_mel is not None and self.log_mel.fmax is not None and self.log_mel.fmax > self.sample_rate / 2:
            raise ValueError(f"log_mel.fmax {self.log_mel.fmax} is above half the sample rate {self.sample_rate}")
        return self


class TextPre(_Finite):
    """``{"text": ...}`` through a Hugging Face ``tokenizer.json`` into ids, mask and token types."""

    tokenizer: str | None = Field(
        None, max_length=MAX_TOKENIZER_CHARS, description="the tokenizer.json (packaged with --tokenizer)"
    )
    max_length: int = Field(128, ge=1, le=8192, description="tokens kept (truncated beyond)")
    pad_to_max_length: bool = Field(False, description="pad to max_length (for a model with a fixed sequence)")
    max_chars: int = Field(20_000, ge=1, le=1_000_000, description="longer texts are refused (413)")
    input_names: dict[Literal["input_ids", "attention_mask", "token_type_ids"], str] = Field(
        default_factory=dict, description="the model input each tensor feeds, where its name differs"
    )


class BoxDecode(_Finite):
    """A detector's (1, N, 4 [+ 1 objectness] + C) output (or (1, 4 + C, N) with ``transposed``)
    → boxes: score threshold, then class-aware non-maximum suppression."""

    format: Literal["xyxy", "cxcywh"] = "xyxy"
    transposed: bool = False
    objectness: bool = Field(False, description="a score column before the classes (YOLOv5): score = obj × class")
    score_threshold: float = Field(0.25, ge=0, le=1)
    iou_threshold: float = Field(0.45, gt=0, le=1)
    # At most 1,000 (Ultralytics answers 300): each kept box costs suppression a pass over the
    # candidates left (edgesdk/pipeline/boxes.py MAX_CANDIDATES), so the cap bounds a request's CPU.
    max_detections: int = Field(100, ge=1, le=1_000)


class PostProcess(_Finite):
    """Turn the model outputs into the task result: labels and scores, a class mask, boxes,
    greedy-CTC text or an embedding."""

    kind: Literal["classes", "mask", "boxes", "ctc", "embedding", "detection"] = "classes"
    output: str | None = Field(None, description="the model output to read (default: the first)")
    activation: Literal["none", "softmax", "sigmoid"] = "none"
    top_k: int = Field(5, ge=1, le=1000)
    threshold: float | None = Field(None, description="drop classes scoring below this (after the activation)")
    labels: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None, max_length=MAX_LABELS, description="class names by index (the labels file packaged with the bundle)"
    )
    mask_layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="where the class axis is in a mask output")
    boxes: BoxDecode = Field(default_factory=BoxDecode)
    vocabulary: list[Annotated[str, Field(max_length=64)]] | None = Field(
        None, max_length=MAX_LABELS, description="CTC tokens by index (the vocabulary file packaged with the bundle)"
    )
    blank: int = Field(0, ge=0, description="the CTC blank's index")
    pool: Literal["none", "mean", "cls"] = Field("none", description="embedding: pool a (1, T, D) output over tokens")
    normalize: bool = Field(True, description="embedding: L2-normalise")
    average: int = Field(
        1,
        ge=1,
        le=1000,
        description="detection: the mean of this many consecutive calls' probabilities (a streaming model's)",
    )

    @model_validator(mode="after")
    def _ctc_vocabulary(self) -> PostProcess:
        if self.kind == "detection" and self.threshold is None:
            raise ValueError("a detection post step needs its threshold (detected when the probability exceeds it)")
        if self.kind == "ctc" and not self.vocabulary:
            raise ValueError("a ctc post step needs its vocabulary (packaged with --vocabulary, one token a line)")
        if self.vocabulary is not None and self.blank >= len(self.vocabulary):
            raise ValueError(f"blank {self.blank} is outside the vocabulary of {len(self.vocabulary)} tokens")
        return self


class Pipeline(_Finite):
    """The whole pipeline: one input decoder, its steps, one post-processing."""

    input: Literal["image", "audio", "text"] = "image"
    image: ImagePre = Field(default_factory=ImagePre)
    audio: AudioPre = Field(default_factory=AudioPre)
    text: TextPre = Field(default_factory=TextPre)
    constants: dict[Annotated[str, Field(max_length=256)], float] = Field(
        default_factory=dict,
        max_length=16,
        description="the model's other inputs, each filled with this value (a recurrent state's 0, a sample rate)",
    )
    post: PostProcess = Field(default_factory=PostProcess)
    folded: list[Literal["normalize", "cast"]] = Field(
        default_factory=list,
        max_length=2,
        description="steps the model graph does (folded in at conversion): the agent skips them, and the model's"
        " input takes the decoded pixels (0..255) instead of the normalized tensor; with cast, as uint8 where the"
        " variant's runtime takes it (its input's dtype in the manifest says)",
    )

    @model_validator(mode="after")
    def _text_has_tokenizer(self) -> Pipeline:
        if self.input == "text" and self.text.tokenizer is None:
            raise ValueError("a text pipeline needs its tokenizer (packaged with --tokenizer tokenizer.json)")
        if self.folded and self.input != "image":
            raise ValueError(f"folded {self.folded} names image steps; this is an {self.input} pipeline")
        if "cast" in self.folded and "normalize" not in self.folded:
            raise ValueError("folded [cast] needs normalize folded too: folded: [normalize, cast]")
        return self


def load_pipeline(
    path: str | Path,
    labels: str | Path | None = None,
    tokenizer: str | Path | None = None,
    vocabulary: str | Path | None = None,
) -> Pipeline:
    """Read a pipeline file (YAML or JSON) and, if given, a labels file (one label a line) into
    ``post.labels``, a ``tokenizer.json`` into ``text.tokenizer`` and a CTC vocabulary file (one
    token a line) into ``post.vocabulary``; any problem is one ``SchemaError``/``UsageError``
    line naming the file."""
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
        _section(data, "post", source)["labels"] = read_labels(Path(labels))
    if vocabulary is not None:
        _section(data, "post", source)["vocabulary"] = read_labels(Path(vocabulary), option="--vocabulary")
    if tokenizer is not None:
        _section(data, "text", source)["tokenizer"] = read_tokenizer(Path(tokenizer))
    return Pipeline.parse_obj_clear(data, source=str(source))


def _section(data: dict[str, object], name: str, source: Path) -> dict[str, object]:
    from edgesdk.errors import UsageError

    section = data.setdefault(name, {})
    if not isinstance(section, dict):
        raise UsageError(f"--pipeline {source}: field {name!r} must be a mapping")
    return section


def read_tokenizer(path: Path) -> str:
    """A Hugging Face ``tokenizer.json``, checked by loading it, compacted for the manifest."""
    import json

    from edgesdk.errors import UsageError

    try:
        text = json.dumps(json.loads(path.read_text(encoding="utf-8")), separators=(",", ":"), ensure_ascii=False)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--tokenizer {path}: cannot read it as JSON ({exc})") from None
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_str(text)
    except ImportError:
        pass  # checked again where it runs; packaging needs no tokenizers
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own untyped Exception
        raise UsageError(f"--tokenizer {path}: not a tokenizers tokenizer.json ({exc})") from None
    if len(text) > MAX_TOKENIZER_CHARS:
        raise UsageError(
            f"--tokenizer {path}: {len(text)} characters compacted; a bundle carries at most {MAX_TOKENIZER_CHARS}"
        )
    return text


def read_labels(path: Path, option: str = "--labels") -> list[str]:
    """A labels (or vocabulary) file: one name a line, by index (blank lines at the end ignored)."""
    from edgesdk.errors import UsageError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option} {path}: cannot read it as UTF-8 text ({exc})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"{option} {path}: nothing in it (one name a line)")
    if option == "--vocabulary":  # a token may be a space: keep it, drop only the line ending
        return lines
    return [line.strip() for line in lines]
