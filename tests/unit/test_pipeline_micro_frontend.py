"""The ``micro_frontend`` audio step (edgesdk/pipeline/micro_frontend.py) against the reference
as shipped: pymicro-features, the TFLite-Micro frontend's C code that pymicro-wakeword feeds its
spotters with. Every feature of every frame must be the same (the numpy code does the
reference's integer arithmetic; a float FFT or a double-precision mel scale moved features by
up to 448 units of 1/25.6). Plus the steps around it: chunks for a streaming model, and the
detection over its calls."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from edgesdk.pipeline import PipelineInputError, preprocess
from edgesdk.pipeline.audio import step_backends
from edgesdk.pipeline.detection import detection
from edgesdk.pipeline.micro_frontend import NATIVE, NUMPY, backend, micro_features, numpy_micro_features
from edgesdk.schemas.pipeline import MicroFrontend, Pipeline, PostProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "embedded_developer"
SPEECH = {
    "okay nabu": EXAMPLES / "keyword_spotter_okay_nabu.wav",
    "the weather": EXAMPLES / "keyword_spotter_weather.wav",
}


def _speech(path: Path) -> np.ndarray:
    with wave.open(str(path)) as source:
        return np.frombuffer(source.readframes(source.getnframes()), "<i2")


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(32000) / 16000
    return {
        **{name: _speech(path) for name, path in SPEECH.items()},
        "loud noise": np.clip(rng.normal(0, 9000, 32000), -32768, 32767).astype(np.int16),
        "quiet noise": rng.normal(0, 30, 32000).astype(np.int16),
        "chirp": (8000 * np.sin(2 * np.pi * (200 + 600 * t) * t) * np.sin(np.pi * t * 3) ** 2).astype(np.int16),
        "clipped square": np.where(np.sin(2 * np.pi * 440 * t) > 0, 32767, -32768).astype(np.int16),
        "silence": np.zeros(16000, np.int16),
    }


def _reference(samples: np.ndarray) -> np.ndarray:
    features_module = pytest.importorskip(
        "pymicro_features", reason="the reference is pymicro-features' C frontend (pip install 'edgesdk[dev]')"
    )
    frontend, rows, at = features_module.MicroFrontend(), [], 0
    data = samples.astype("<i2").tobytes()
    while at + 320 <= len(data):  # 10 ms at a time, as pymicro-wakeword feeds it
        out = frontend.process_samples(data[at : at + 320])
        at += out.samples_read * 2
        if out.features:
            rows.append(out.features)
    return np.array(rows, np.float64).reshape(-1, 40)


def test_micro_frontend_matches_pymicro_features_on_every_frame() -> None:
    spec = MicroFrontend()
    for name, samples in _signals().items():
        expected = _reference(samples)
        got = numpy_micro_features(samples, 16000, spec)
        assert got.shape == expected.shape, name
        units = np.abs(got.astype(np.float64) - expected) * 25.6  # in the frontend's uint16 units
        assert units.max() == 0, f"{name}: worst frame {units.max(axis=1).argmax()}, {units.max()} units off"


def test_micro_frontend_runs_pymicro_features_where_installed_with_the_numpy_frames() -> None:
    pytest.importorskip(
        "pymicro_features", reason="the C frontend is pymicro-features (pip install 'edgesdk[pipeline]')"
    )
    spec = MicroFrontend()
    assert backend(spec, 16000) == NATIVE
    for name, samples in _signals().items():
        assert np.array_equal(micro_features(samples, 16000, spec), numpy_micro_features(samples, 16000, spec)), name


def test_micro_frontend_settings_pymicro_features_lacks_run_on_numpy() -> None:
    assert backend(MicroFrontend(channels=32), 16000) == NUMPY
    assert backend(MicroFrontend(), 8000) == NUMPY
    samples = _speech(SPEECH["okay nabu"])
    assert micro_features(samples, 16000, MicroFrontend(channels=32)).shape == (141, 32)


def test_only_a_pipeline_with_a_micro_frontend_names_its_step_backends() -> None:
    audio = Pipeline.model_validate({"input": "audio", "audio": {"micro_frontend": {"channels": 32}}})
    assert step_backends(audio) == {"micro_frontend": NUMPY}
    assert step_backends(Pipeline.model_validate({"input": "audio", "audio": {"log_mel": {}}})) == {}
    assert step_backends(None) == {}


def test_micro_frontend_takes_float_samples_as_their_16_bit_values() -> None:
    samples = _speech(SPEECH["okay nabu"])
    spec = MicroFrontend()
    assert np.array_equal(
        micro_features(samples.astype(np.float32) / 32768, 16000, spec), micro_features(samples, 16000, spec)
    )


def test_micro_frontend_makes_no_frame_of_less_than_one_window() -> None:
    assert micro_features(np.zeros(479, np.int16), 16000, MicroFrontend()).shape == (0, 40)
    assert micro_features(np.zeros(480 + 160 * 4, np.int16), 16000, MicroFrontend()).shape == (5, 40)


class _Input:
    name, dtype, shape = "input_audio", "float32", [1, 3, 40]


def test_a_streaming_pipeline_cuts_the_features_into_whole_chunks_of_calls() -> None:
    pipeline = Pipeline.model_validate({"input": "audio", "audio": {"micro_frontend": {}, "stream": {"frames": 3}}})
    body = (EXAMPLES / "keyword_spotter_okay_nabu.wav").read_bytes()
    feeds = preprocess(pipeline, body, "audio/wav", [_Input()])
    frames = micro_features(_speech(SPEECH["okay nabu"]), 16000, MicroFrontend())
    calls = frames.shape[0] // 3
    assert feeds["input_audio"].shape == (calls, 1, 3, 40)
    assert np.array_equal(feeds["input_audio"].reshape(-1, 40), frames[: calls * 3])
    with pytest.raises(PipelineInputError, match="send at least 50 ms") as short:
        preprocess(pipeline, _wav_bytes(np.zeros(700, np.int16)), "audio/wav", [_Input()])
    assert short.value.status == 422


class _SecondInput:
    name, dtype, shape = "input_audio", "float32", [1, 98, 40]


def test_a_16_bit_wav_padded_to_length_gives_the_features_of_its_zero_padded_samples() -> None:
    # 16-bit mono WAVs at the model's rate reach the frontend as they are (no float round trip):
    # the padding must stay 16-bit samples, not floats the frontend would read as [-1, 1).
    pipeline = Pipeline.model_validate({"input": "audio", "audio": {"length": 16000, "micro_frontend": {}}})
    samples = _speech(SPEECH["okay nabu"])[4000:12000]
    feeds = preprocess(pipeline, _wav_bytes(samples), "audio/wav", [_SecondInput()])
    padded = np.concatenate([samples, np.zeros(8000, np.int16)])
    assert np.array_equal(feeds["input_audio"][0], numpy_micro_features(padded, 16000, MicroFrontend()))


def test_a_streaming_pipeline_refuses_more_calls_than_it_allows() -> None:
    limited = {"input": "audio", "audio": {"micro_frontend": {}, "stream": {"frames": 3, "max_calls": 10}}}
    pipeline = Pipeline.model_validate(limited)
    body = (EXAMPLES / "keyword_spotter_okay_nabu.wav").read_bytes()  # 47 calls
    with pytest.raises(
        PipelineInputError, match="makes 47 calls of this streaming model; its pipeline allows 10"
    ) as many:
        preprocess(pipeline, body, "audio/wav", [_Input()])
    assert many.value.status == 413


def _wav_bytes(samples: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def test_detection_is_the_best_mean_of_consecutive_calls_above_the_threshold() -> None:
    post = PostProcess(kind="detection", average=3, threshold=0.85)
    probabilities = np.array([0.0, 0.9, 0.9, 0.9, 0.6, 1.0])[:, None, None]  # stacked (calls, 1, 1)
    assert detection(probabilities, post) == {"detected": True, "probability": pytest.approx(0.9), "calls": 6}
    assert detection(np.array([0.9, 0.7, 0.9])[:, None], post)["detected"] is False  # their mean: 0.833
    assert detection(np.array([1.0, 1.0])[:, None], post) == {"detected": False, "probability": 0.0, "calls": 2}
    with pytest.raises(PipelineInputError, match="one probability per call"):
        detection(np.zeros((4, 2)), post)


def test_a_detection_pipeline_needs_its_threshold_and_one_way_to_frame() -> None:
    with pytest.raises(ValueError, match="needs its threshold"):
        PostProcess(kind="detection")
    with pytest.raises(ValueError, match="log_mel and micro_frontend"):
        Pipeline.model_validate({"input": "audio", "audio": {"log_mel": {}, "micro_frontend": {}}})
    with pytest.raises(ValueError, match="name log_mel or micro_frontend"):
        Pipeline.model_validate({"input": "audio", "audio": {"stream": {"frames": 3}}})
