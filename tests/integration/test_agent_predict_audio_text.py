"""``POST /v1/models/{name}/predict`` with audio and text, end to end: one real ``edge-agent run``
process serves two bundles whose pipelines are signed in: all-MiniLM-L6-v2 (its last hidden
state exported to ONNX; the pipeline tokenizes ``{"text": ...}`` with the model's own
tokenizer.json and mean-pools + L2-normalises) and Silero VAD (from its wheel: 16 kHz samples
with a zero recurrent state and the rate as constants, speech probability out). Each answer is
checked against the usual host code: transformers + mean-pool for the text, the stdlib ``wave``
+ scipy + onnxruntime for the audio; bad bodies are 4xx with their reason."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, agent_env, make_device, run_agent_cli

ort = pytest.importorskip("onnxruntime")
httpx = pytest.importorskip("httpx")
pytest.importorskip("scipy.signal", reason="resampling needs scipy (pip install 'edgesdk[pipeline]')")
pytest.importorskip("tokenizers", reason="the text pipeline needs tokenizers (pip install 'edgesdk[pipeline]')")

SENTENCES = [
    "The agent answers raw text with the same embedding as the host.",
    "A microphone and a text box do not produce tensors.",
    "Silero detects speech in short chunks of sixteen kilohertz audio.",
]
TEXT_PIPELINE = "input: text\ntext: {max_length: 128}\npost: {kind: embedding, pool: mean, normalize: true}\n"
VAD_PIPELINE = """\
input: audio
audio: {sample_rate: 16000, length: 576, max_bytes: 400000}   # 512 samples + 64 of context, as Silero takes
constants: {state: 0, sr: 16000}
post: {kind: classes, output: output, top_k: 1}
"""
MINILM_IO = ("input_ids", "attention_mask", "token_type_ids")


def _spec(name: str, dtype: str, shape: list[Any]) -> Any:
    from edgesdk.schemas.manifest import TensorSpec

    return TensorSpec(name=name, dtype=dtype, shape=shape)


def _convert_dir(
    out: Path,
    name: str,
    model: Path,
    inputs: list[Any],
    outputs: list[Any],
    golden: dict[str, np.ndarray] | None = None,
) -> Path:
    """A convert output dir holding ``model`` as its one fp32 ONNX variant (no conversion run),
    with ``golden`` (inputs, and ``output:NAME``) for the agent's check at install."""
    from datetime import datetime, timezone

    from edgesdk.schemas.manifest import AccuracyResult
    from edgesdk.schemas.report import ConversionReport, ShippedVariant

    (out / "artifacts" / "onnx-fp32").mkdir(parents=True, exist_ok=True)
    target = out / "artifacts" / "onnx-fp32" / "model.onnx"
    if not target.exists():
        os.link(model, target) if model.stat().st_dev == out.stat().st_dev else target.write_bytes(model.read_bytes())
    variant = ShippedVariant(
        id="onnx-fp32", format="onnx", precision="fp32", runtime="onnxruntime", files=[target.relative_to(out).as_posix()],
        size=target.stat().st_size, inputs=inputs, outputs=outputs,
        accuracy=AccuracyResult(metric="cosine", value=1.0, gate=0.99, passed=True, samples=1, note="the source itself"),
    )  # fmt: skip
    report = ConversionReport(
        model_name=name, source="tests", profile=PROFILE, created=datetime.now(timezone.utc), metric="cosine",
        gate=0.99, variants=[variant], golden="golden.npz" if golden else None,
    )  # fmt: skip
    if golden:
        np.savez(out / "golden.npz", **golden)  # type: ignore[arg-type]
    (out / "report.json").write_text(report.model_dump_json(indent=2))
    return out


@pytest.fixture(scope="module")
def minilm(request) -> tuple[Path, Path]:
    """(the model's Hugging Face folder, its last hidden state as ONNX), exported once per cache."""
    pytest.importorskip("transformers", reason="the reference embedding loads MiniLM with transformers")
    from edgesdk.errors import ModelError
    from edgesdk.workloads.text_encoder import model_dir

    try:
        folder = model_dir()
    except ModelError as exc:
        pytest.skip(str(exc))
    onnx = Path(request.config.cache.mkdir("edgesdk-minilm-hidden-onnx-v1")) / "minilm.onnx"
    if not onnx.exists():
        import torch

        class Hidden(torch.nn.Module):
            def __init__(self, bert: Any) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, ids: Any, mask: Any, types: Any) -> Any:
                return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

        ids = torch.ones((1, 8), dtype=torch.int64)
        partial = onnx.with_suffix(".part")
        axes = {n: {0: "batch", 1: "sequence"} for n in (*MINILM_IO, "last_hidden_state")}
        torch.onnx.export(
            Hidden(_hf_model(folder)), (ids, ids, ids * 0), str(partial), input_names=list(MINILM_IO),
            output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
        partial.rename(onnx)
    return folder, onnx


def _hf_model(folder: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def vad_onnx(tmp_path_factory) -> Path:
    from tests.prebuilt_models import SILERO_VAD, extract

    return extract(SILERO_VAD, "silero_vad.onnx", tmp_path_factory.mktemp("vad"))


def _package(device: Any, convert: Path, name: str, pipeline: str, *extra: str, labels: Path | None = None) -> Path:
    """The text bundle through ``edgesdk package --pipeline --tokenizer`` (the real CLI), the VAD's
    through ``edgesdk.toolchain.package`` (in process: one interpreter start less); installed on ``device``."""
    (device.root / f"{name}.yaml").write_text(pipeline)
    bundle = device.root / f"{name}.edgepkg"
    if extra:
        packaged = subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", "package", str(convert), "--name", name, "--version", "1.0.0"]
            + ["--release", "1", "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub)]
            + ["--target", PROFILE, "--out", str(bundle), "--pipeline", str(device.root / f"{name}.yaml"), *extra],
            capture_output=True, text=True, env=agent_env(), timeout=120,
        )  # fmt: skip
        assert packaged.returncode == 0, packaged.stderr
    else:
        from edgesdk.toolchain import package

        package(
            convert, out=bundle, name=name, version="1.0.0", release=1, publisher_key=device.publisher_key,
            recipients=device.device_pub, targets=[PROFILE], pipeline=device.root / f"{name}.yaml", labels=labels,
        )  # fmt: skip
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr
    return bundle


@pytest.fixture(scope="module")
def audio_text_agent(minilm, vad_onnx, tmp_path_factory):
    folder, onnx = minilm
    root = tmp_path_factory.mktemp("agent-predict-audio-text")
    device = make_device(root / "device")
    ids = [_spec(n, "int64", ["batch", "sequence"]) for n in MINILM_IO]
    hidden = [_spec("last_hidden_state", "float32", ["batch", "sequence", 384])]
    text_dir = _convert_dir(root / "minilm", "minilm", onnx, ids, hidden)
    _package(device, text_dir, "minilm", TEXT_PIPELINE, "--tokenizer", str(folder / "tokenizer.json"))
    vad_inputs = [
        _spec("input", "float32", ["batch", "samples"]), _spec("state", "float32", [2, "batch", 128]),
        _spec("sr", "int64", []),
    ]  # fmt: skip
    vad_outputs = [_spec("output", "float32", ["batch", 1]), _spec("stateN", "float32", [2, "batch", 128])]
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32)}
    feeds["sr"] = np.array(16000, np.int64)
    session = ort.InferenceSession(str(vad_onnx), providers=["CPUExecutionProvider"])
    golden = feeds | {f"output:{o.name}": value for o, value in zip(session.get_outputs(), session.run(None, feeds))}
    vad_dir = _convert_dir(root / "vad", "vad", vad_onnx, vad_inputs, vad_outputs, golden)
    (root / "labels.txt").write_text("speech\n")
    _package(device, vad_dir, "vad", VAD_PIPELINE, labels=root / "labels.txt")
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def test_agent_embeds_text_as_transformers_with_mean_pooling_does(audio_text_agent, minilm) -> None:
    import torch
    from transformers import AutoTokenizer

    from edgesdk.client import AgentClient

    folder, _ = minilm
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = _hf_model(folder)
    with AgentClient(audio_text_agent.url) as client, torch.no_grad():
        for sentence in SENTENCES:
            answer = client.predict("minilm", {"text": sentence})
            assert isinstance(answer, dict) and answer["variant"] == "onnx-fp32"
            batch = tokenizer([sentence], return_tensors="pt", truncation=True, max_length=128)
            hidden = model(**batch).last_hidden_state
            weights = batch["attention_mask"].unsqueeze(-1).float()
            expected = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)[0].numpy()
            got = np.asarray(answer["embedding"])
            cosine = float(got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected)))
            assert got.shape == (384,) and cosine >= 0.9999, (sentence, cosine)


def _wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(samples.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.round(samples * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def _voice_like(rate: int, channels: int, seed: int) -> np.ndarray:
    """A buzzing glottal pulse train through a few formant-like resonances, with noise."""
    t = np.arange(int(rate * 0.05)) / rate
    rng = np.random.default_rng(seed)
    pitch = 110 + 40 * seed
    source = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 30))
    voice = 0.3 * source / np.abs(source).max() + 0.02 * rng.normal(size=t.size)
    return np.repeat(voice[:, None], channels, axis=1)


def _reference_speech_probability(session: Any, wav: bytes) -> float:
    """The usual host code: stdlib wave, numpy scaling and downmix, scipy resampling, onnxruntime."""
    from math import gcd

    from scipy.signal import resample_poly

    with wave.open(io.BytesIO(wav)) as source:
        rate, channels = source.getframerate(), source.getnchannels()
        pcm = np.frombuffer(source.readframes(source.getnframes()), "<i2").reshape(-1, channels)
    mono = (pcm.astype(np.float32) / 32768.0).mean(axis=1)
    if rate != 16000:
        g = gcd(rate, 16000)
        mono = resample_poly(mono, 16000 // g, rate // g).astype(np.float32)
    chunk = np.zeros(576, np.float32)
    chunk[: min(576, mono.size)] = mono[:576]
    feeds = {"input": chunk[None], "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    return float(session.run(["output"], feeds)[0][0, 0])


def test_agent_answers_wavs_with_the_speech_probability_of_the_host_code(audio_text_agent, vad_onnx) -> None:
    from edgesdk.client import AgentClient

    session = ort.InferenceSession(str(vad_onnx), providers=["CPUExecutionProvider"])
    wavs = [
        _wav(_voice_like(16000, 1, 0), 16000),
        _wav(_voice_like(48000, 2, 1), 48000),
        _wav(np.zeros((800, 1)), 16000),
    ]
    with AgentClient(audio_text_agent.url) as client:
        for wav in wavs:
            answer = client.predict("vad", wav)
            assert isinstance(answer, dict)
            (best,) = answer["labels"]
            assert best["label"] == "speech"
            assert best["score"] == pytest.approx(_reference_speech_probability(session, wav), abs=1e-5)


def test_bad_audio_and_text_bodies_are_4xx_with_their_reason(audio_text_agent) -> None:
    base = f"{audio_text_agent.url}/v1/models"
    wav = _wav(_voice_like(16000, 1, 0), 16000)
    bomb = wav[:40] + struct.pack("<I", 1_000_000_000) + wav[44:]  # the data chunk declares 1 GB
    cases = [
        ("vad", wav, "audio/mpeg", 415, "use audio/wav"),
        ("vad", wav[:30] + b"\x00" * 20, "audio/wav", 400, "WAV"),
        ("vad", bomb, "audio/wav", 413, "declares 1000000000 bytes"),
        ("minilm", b'{"text": "unterminated', "application/json", 400, "not valid JSON"),
        ("minilm", json.dumps({"text": "hi"}).encode(), "text/plain", 415, "application/json"),
        ("minilm", json.dumps({"text": 3}).encode(), "application/json", 400, "one string"),
    ]
    with httpx.Client(timeout=30) as client:
        for model, body, media, status, reason in cases:
            answer = client.post(f"{base}/{model}/predict", content=body, headers={"Content-Type": media})
            assert answer.status_code == status and reason in answer.json()["error"], (model, media, answer.text)
        after = client.post(f"{base}/vad/predict", content=wav, headers={"Content-Type": "audio/wav"})
        assert after.status_code == 200 and after.json()["labels"][0]["label"] == "speech"
