"""``POST /v1/models/okay_nabu/predict`` with a WAV, end to end: pymicro-wakeword's real
"okay nabu" streaming int8 keyword spotter, shipped ``--as-is`` with a signed pipeline (WAV →
the TFLite-Micro audio frontend → the model over its 3-frame chunks from its initial state →
the mean of 5 calls' probabilities against 0.85), served by one real ``edge-agent run``.
Each answer is checked against the usual host code: pymicro-wakeword's own detector (its
C frontend, its own TFLite build) on the same WAV. The WAVs: espeak-ng saying "Okay Nabu" and
"The weather is nice today." (examples/embedded_developer/keyword_spotter_*.wav), the first
one again as 22.05 kHz stereo float, and noise."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, make_device, run_agent_cli

pytest.importorskip("ai_edge_litert", reason="the spotter is served by LiteRT (edgesdk[litert])")
pytest.importorskip("scipy.signal", reason="resampling needs scipy (pip install 'edgesdk[pipeline]')")
httpx = pytest.importorskip("httpx")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "embedded_developer"
PIPELINE = EXAMPLES / "keyword_spotter.yaml"
OKAY_NABU, WEATHER = EXAMPLES / "keyword_spotter_okay_nabu.wav", EXAMPLES / "keyword_spotter_weather.wav"


def _wav(samples: np.ndarray, rate: int, float32: bool = False) -> bytes:
    """A WAV of (frames, channels) samples in [-1, 1): 16-bit PCM, or 32-bit float written by hand."""
    if not float32:
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(samples.shape[1])
            out.setsampwidth(2)
            out.setframerate(rate)
            out.writeframes(np.clip(np.rint(samples * 32768), -32768, 32767).astype("<i2").tobytes())
        return buffer.getvalue()
    import struct

    data = samples.astype("<f4").tobytes()
    channels = samples.shape[1]
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )


def _pcm16(wav: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav)) as source:
        return np.frombuffer(source.readframes(source.getnframes()), "<i2")


def _reference(wav: bytes) -> tuple[float, bool]:
    """pymicro-wakeword's detector on the WAV's 16 kHz 16-bit samples: its highest mean probability."""
    wakeword = pytest.importorskip(
        "pymicro_wakeword", reason="the reference detector is pymicro-wakeword (pip install 'edgesdk[dev]')"
    )
    detector = wakeword.MicroWakeWord.from_builtin(wakeword.Model.OKAY_NABU)
    features = wakeword.MicroWakeWordFeatures()
    probabilities = [detector.process_streaming_prob(f) for f in features.process_streaming(_pcm16(wav).tobytes())]
    best = max(p for p in probabilities if p is not None)
    return best, best > detector.probability_cutoff


@pytest.fixture(scope="module")
def spotter_agent(tmp_path_factory):
    from edgesdk.toolchain import convert, package
    from tests.prebuilt_models import WAKEWORD, extract

    root = tmp_path_factory.mktemp("agent-predict-keyword")
    model = extract(WAKEWORD, "okay_nabu.tflite", root / "model")  # skips without the wheel
    device = make_device(root / "device")
    frames = np.random.default_rng(0).integers(-128, -90, (8, 3, 40)).astype(np.int8)
    report = convert(model, PROFILE, out=root / "convert", validation={"input_audio": frames}, as_is=True)
    bundle = package(
        report, out=root / "okay_nabu.edgepkg", name="okay_nabu", version="1.0.0", release=1,
        publisher_key=device.publisher_key, recipients=device.device_pub, targets=[PROFILE], pipeline=PIPELINE,
    )  # fmt: skip
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def _post(agent: AgentProcess, wav: bytes) -> httpx.Response:
    return httpx.post(
        f"{agent.url}/v1/models/okay_nabu/predict", content=wav, headers={"Content-Type": "audio/wav"}, timeout=30
    )


def test_agent_spots_okay_nabu_in_wavs_as_pymicro_wakeword_does(spotter_agent) -> None:
    okay = OKAY_NABU.read_bytes()
    samples = _pcm16(okay).astype(np.float32) / 32768
    from scipy.signal import resample_poly

    stereo = np.repeat(resample_poly(samples, 441, 320)[:, None], 2, axis=1)
    wavs = {
        "okay nabu": okay,
        "the weather": WEATHER.read_bytes(),
        "noise": _wav(np.random.default_rng(3).normal(0, 0.05, (24000, 1)), 16000),
    }
    for name, wav in wavs.items():
        answer = _post(spotter_agent, wav)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        probability, detected = _reference(wav)
        assert body["detected"] == detected, (name, body, probability)
        assert body["probability"] == pytest.approx(probability, abs=1e-6), (name, body, probability)
        assert body["calls"] == (1 + (len(_pcm16(wav)) - 480) // 160) // 3  # whole chunks of 3 frames
    assert _post(spotter_agent, okay).json()["detected"] is True
    assert _post(spotter_agent, wavs["the weather"]).json()["detected"] is False
    # The same words at 22.05 kHz, two float channels: resampled and rounded to 16 bits, still spotted.
    assert _post(spotter_agent, _wav(stereo, 22050, float32=True)).json()["detected"] is True


def test_each_wav_starts_the_spotter_from_its_initial_state(spotter_agent) -> None:
    okay, weather = OKAY_NABU.read_bytes(), WEATHER.read_bytes()
    first = _post(spotter_agent, weather).json()
    assert _post(spotter_agent, okay).json()["detected"] is True
    # Right after the keyword: served on the model's state as the keyword left it, the other
    # sentence is "detected" (measured: the calls' state carries the keyword into it).
    after = _post(spotter_agent, weather).json()
    assert after == first and after["detected"] is False


def test_a_wav_too_short_for_one_call_is_a_422_with_the_length_needed(spotter_agent) -> None:
    answer = _post(spotter_agent, _wav(np.zeros((400, 1)), 16000))
    assert answer.status_code == 422, answer.text
    assert "send at least 50 ms" in answer.text


def test_the_models_info_says_which_code_runs_the_audio_frontend(spotter_agent) -> None:
    import importlib.util

    models = httpx.get(f"{spotter_agent.url}/v1/models", timeout=10).json()["models"]
    (spotter,) = [model for model in models if model["name"] == "okay_nabu"]
    # The agent runs in this venv: pymicro-features' C code where it is installed, else numpy.
    expected = "pymicro-features" if importlib.util.find_spec("pymicro_features") else "numpy"
    assert spotter["pipeline_backends"] == {"micro_frontend": expected}
