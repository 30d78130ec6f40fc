"""Stateful int8: calibrating on the states a stream reaches vs on the initial state only.

A VAD-shaped recurrent cell (tests/onnx_builders.stateful_vad, widened to 256 features and a
128-wide state) is quantized with onnxruntime's static QDQ from 32 calibration streams of 16
steps and validated over 32 other streams with the state fed back. The same conversion runs
twice, side by side: once as edgesdk does it (each calibration step with the state the source
model reached there) and once with every step given the stream's initial state, which is what
a quantizer sees from the raw data file.

    .venv/bin/python benchmarks/bench_stateful_calibration.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import edgesdk.converters.pipeline as pipeline

    import tests.onnx_builders as builders
    from edgesdk.toolchain import convert

    builders.FRAME, builders.HIDDEN = 256, 128
    work = Path(tempfile.mkdtemp(prefix="bench-stateful-"))
    try:
        model = builders.stateful_vad(work / "vad.onnx")
        np.savez(work / "cal.npz", **builders.vad_stream(32, steps=16, seed=1))
        np.savez(work / "val.npz", **builders.vad_stream(32, steps=16, seed=2))
        reached = pipeline.calibration_states
        print(f"{'calibration':<22} {'int8 bytes':>10} {'cosine':>8} {'max|d| prob':>12} {'max|d| stateN':>14}")
        for label, states in (("reached states", reached), ("initial state only", lambda source, cal: dict(cal))):
            pipeline.calibration_states = states
            out = work / label.replace(" ", "-")
            report = convert(
                str(model), "rpi5-8gb", out=out, calibration=work / "cal.npz", validation=work / "val.npz",
                formats="onnx", precisions="fp32,int8", int8_methods=["static-qdq-per-channel"], metric="cosine",
                gate=0.0,
            )  # fmt: skip
            (int8,) = [v for v in report.variants if v.precision.value == "int8"]
            diff = int8.accuracy.max_abs_diff
            print(
                f"{label:<22} {int8.size:>10} {int8.accuracy.value:>8.4f} {diff['prob']:>12.4f} {diff['stateN']:>14.4f}"
            )
        pipeline.calibration_states = reached
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
