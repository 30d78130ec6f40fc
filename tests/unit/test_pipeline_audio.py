"""The pipeline's audio steps (edgesdk/pipeline/audio.py) against references written the usual
way: the stdlib ``wave`` module to read, numpy to scale and downmix, scipy to resample, and a
log-mel built term by term (a direct DFT per frame, each HTK triangle from its formula)."""

from __future__ import annotations

import io
import math
import struct
import sys
import wave

import numpy as np
import pytest

from edgesdk.pipeline import Limits, PipelineInputError, preprocess
from edgesdk.pipeline.audio import open_audio
from edgesdk.schemas.manifest import TensorSpec
from edgesdk.schemas.pipeline import Pipeline

signal = pytest.importorskip("scipy.signal", reason="resampling needs scipy (pip install 'edgesdk[pipeline]')")

WAVEFORM = [TensorSpec(name="audio", dtype="float32", shape=["batch", "samples"])]


def _wav16(samples: np.ndarray, rate: int) -> bytes:
    """int16 (frames, channels) → a WAV, written with the stdlib."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(samples.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def _wav_float(samples: np.ndarray, rate: int, extensible: bool = False) -> bytes:
    """float32 (frames, channels) → a WAV of format 3 (or WAVE_FORMAT_EXTENSIBLE carrying 3)."""
    channels = samples.shape[1]
    tag = 0xFFFE if extensible else 3
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * 4, channels * 4, 32)
    if extensible:
        fmt += struct.pack("<HHI", 22, 32, 0) + struct.pack("<H", 3) + bytes(14)
    data = samples.astype("<f4").tobytes()
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _tone(rate: int, seconds: float, channels: int = 1, seed: int = 0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    rng = np.random.default_rng(seed)
    waves = [0.4 * np.sin(2 * np.pi * (220 + 330 * c) * t) + 0.05 * rng.normal(size=t.size) for c in range(channels)]
    return np.stack(waves, axis=1)


def _reference_log_mel(
    x: np.ndarray, rate: int, n_fft: int, hop: int, n_mels: int, fmin: float, fmax: float
) -> np.ndarray:
    def mel(hz: float) -> float:
        return 2595.0 * math.log10(1.0 + hz / 700.0)

    def hz(m: float) -> float:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = [hz(mel(fmin) + i * (mel(fmax) - mel(fmin)) / (n_mels + 1)) for i in range(n_mels + 2)]
    filters = np.zeros((n_mels, n_fft // 2 + 1))
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        for k in range(n_fft // 2 + 1):
            f = k * rate / n_fft
            if lo <= f <= mid:
                filters[m, k] = (f - lo) / (mid - lo)
            elif mid < f <= hi:
                filters[m, k] = (hi - f) / (hi - mid)
    window = [0.5 - 0.5 * math.cos(2 * math.pi * n / n_fft) for n in range(n_fft)]  # periodic Hann
    dft = np.exp(-2j * np.pi * np.outer(np.arange(n_fft // 2 + 1), np.arange(n_fft)) / n_fft)
    rows = []
    for start in range(0, len(x) - n_fft + 1, hop):
        spectrum = dft @ (x[start : start + n_fft] * window)
        rows.append(np.log(filters @ (np.abs(spectrum) ** 2) + 1e-6))
    return np.array(rows)


def test_stereo_44k_wav_to_log_mel_matches_wave_scipy_and_a_term_by_term_reference() -> None:
    raw = np.round(_tone(44100, 0.25, channels=2) * 32767).astype(np.int16)
    pipeline = Pipeline.model_validate(
        {
            "input": "audio",
            "audio": {
                "sample_rate": 16000,
                "log_mel": {"n_fft": 400, "hop": 160, "n_mels": 40, "fmin": 20, "fmax": 7600},
            },
        }
    )
    spec = [TensorSpec(name="mel", dtype="float32", shape=["batch", 1, "frames", 40])]
    feeds = preprocess(pipeline, _wav16(raw, 44100), "audio/wav", spec)

    with wave.open(io.BytesIO(_wav16(raw, 44100))) as source:
        pcm = np.frombuffer(source.readframes(source.getnframes()), "<i2").reshape(-1, 2)
    mono = (pcm / 32768.0).mean(axis=1)
    resampled = signal.resample_poly(mono, 160, 441)
    expected = _reference_log_mel(resampled, 16000, 400, 160, 40, 20.0, 7600.0)

    assert feeds["mel"].shape == (1, 1, *expected.shape) and feeds["mel"].dtype == np.float32
    np.testing.assert_allclose(feeds["mel"][0, 0], expected, rtol=1e-4, atol=2e-4)


def test_float_and_extensible_wavs_and_raw_pcm_decode_to_the_same_waveform() -> None:
    mono = _tone(16000, 0.05)
    pipeline = Pipeline.model_validate({"input": "audio", "audio": {"sample_rate": 16000, "pcm": {"rate": 16000}}})
    plain = preprocess(pipeline, _wav_float(mono, 16000), "audio/wav", WAVEFORM)["audio"]
    extensible = preprocess(pipeline, _wav_float(mono, 16000, extensible=True), "audio/x-wav", WAVEFORM)["audio"]
    np.testing.assert_array_equal(plain[0], mono[:, 0].astype(np.float32))
    np.testing.assert_array_equal(extensible, plain)
    as_int = np.round(mono * 32767).astype("<i2")
    raw = preprocess(pipeline, as_int.tobytes(), "audio/pcm", WAVEFORM)["audio"]
    np.testing.assert_allclose(raw[0], as_int[:, 0] / 32768.0, atol=1e-7)


def test_framing_with_a_hamming_window_and_padding_to_a_fixed_length() -> None:
    mono = _tone(16000, 0.03)
    pipeline = Pipeline.model_validate(
        {"input": "audio", "audio": {"length": 640, "framing": {"length": 160, "hop": 80, "window": "hamming"}}}
    )
    spec = [TensorSpec(name="frames", dtype="float32", shape=[1, 7, 160])]
    out = preprocess(pipeline, _wav_float(mono, 16000), "audio/wav", spec)["frames"]
    padded = np.concatenate([mono[:, 0], np.zeros(640 - len(mono))])
    hamming = [0.54 - 0.46 * math.cos(2 * math.pi * n / 160) for n in range(160)]  # periodic
    expected = np.array([padded[s : s + 160] * hamming for s in range(0, 640 - 160 + 1, 80)])
    assert out.shape == (1, 7, 160)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-6)


def test_a_wav_over_the_limit_is_refused_by_its_declared_size_before_any_sample_is_read() -> None:
    pipeline = Pipeline.model_validate({"input": "audio", "audio": {"max_bytes": 64_000}})
    header = _wav16(np.zeros((4, 1), np.int16), 16000)
    bomb = header[:40] + struct.pack("<I", 2_000_000_000) + header[44:]  # the data chunk claims 2 GB
    with pytest.raises(PipelineInputError, match=r"declares 2000000000 bytes.*allows 64000") as refused:
        preprocess(pipeline, bomb, "audio/wav", WAVEFORM)
    assert refused.value.status == 413

    charged: list[int] = []

    def over_allowance(size: int, what: str) -> None:
        charged.append(size)
        raise PipelineInputError(413, f"{what}: over the request's allowance")

    fine = _wav16(np.zeros((16000, 2), np.int16), 16000)
    with pytest.raises(PipelineInputError, match="the decoded audio: over"):
        preprocess(pipeline, fine, "audio/wav", WAVEFORM, Limits(charge=over_allowance))
    assert charged and charged[0] >= 16000 * 2 * 4  # float32 samples of both channels, charged first


def test_corrupt_truncated_and_mistyped_audio_are_4xx_with_the_reason() -> None:
    pipeline = Pipeline.model_validate({"input": "audio"})
    wav = _wav16(np.zeros((100, 1), np.int16), 16000)
    cases = {
        (b"RIFX" + wav[4:], "audio/wav"): (400, "no RIFF/WAVE header"),
        (wav[:-50], "audio/wav"): (400, "truncated"),
        (wav[:36], "audio/wav"): (400, "no data chunk"),
        (wav[:20] + struct.pack("<H", 6) + wav[22:], "audio/wav"): (400, "WAV format 6"),
        (wav, "audio/mpeg"): (415, "use audio/wav"),
        (b"\x00\x01" * 8, "audio/pcm"): (415, "use audio/wav"),  # no pcm: declared in this pipeline
    }
    for (body, media), (status, reason) in cases.items():
        with pytest.raises(PipelineInputError, match=reason) as refused:
            open_audio(body, media, pipeline.audio)
        assert refused.value.status == status, reason


def test_without_scipy_resampling_answers_501_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.signal", None)  # as on an agent installed without the extra
    pipeline = Pipeline.model_validate({"input": "audio", "audio": {"sample_rate": 16000}})
    with pytest.raises(PipelineInputError, match=r"pip install 'edgesdk\[pipeline\]'") as missing:
        preprocess(pipeline, _wav16(np.zeros((441, 1), np.int16), 44100), "audio/wav", WAVEFORM)
    assert missing.value.status == 501
