"""A bounded property-based fuzz of the pipeline's audio entry (edgesdk/pipeline/audio.py through
``preprocess``): real WAV files (16-bit stereo, float mono) with bytes flipped, cut or inserted,
and random bytes. Whatever comes, the only error is a ``PipelineInputError`` with a 4xx status,
and what decodes is a finite tensor of the pipeline's shape.

Bounded: 300 examples, no deadline per example (the machine is shared); runs in a few seconds."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the dev extra installs it)")
pytest.importorskip("scipy.signal", reason="resampling needs scipy (pip install 'edgesdk[pipeline]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.pipeline import PipelineInputError, preprocess  # noqa: E402
from edgesdk.schemas.manifest import TensorSpec  # noqa: E402
from edgesdk.schemas.pipeline import Pipeline  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIPELINE = Pipeline.model_validate(
    {
        "input": "audio",
        "audio": {"length": 1600, "log_mel": {"n_fft": 256, "hop": 128, "n_mels": 8}, "max_bytes": 200_000},
    }
)
INPUTS = [TensorSpec(name="mel", dtype="float32", shape=[1, 11, 8])]


def _stereo16() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(np.random.default_rng(4).integers(-30000, 30000, (400, 2), dtype="<i2").tobytes())
    return buffer.getvalue()


def _float_mono() -> bytes:
    data = np.random.default_rng(5).uniform(-1, 1, 300).astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 22050, 22050 * 4, 4, 32)
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


SEEDS = [_stereo16(), _float_mono()]


@st.composite
def mutated_wavs(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del data[at:]
            if not data:
                break
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@FUZZ
@given(st.one_of(mutated_wavs(), st.binary(max_size=256)))
def test_audio_entry_answers_any_bytes_with_a_tensor_or_a_4xx(data: bytes) -> None:
    try:
        feeds = preprocess(PIPELINE, data, "audio/wav", INPUTS)
    except PipelineInputError as refused:
        assert 400 <= refused.status < 500, refused
        return
    assert feeds["mel"].shape == (1, 11, 8) and feeds["mel"].dtype == np.float32
    assert np.isfinite(feeds["mel"]).all()
