"""Mutated bodies against a real agent's ``POST /v1/models/{name}/predict`` (issue 42): one
``edge-agent run`` process serves the digits CNN (PNG/JPEG in), Silero VAD (WAV in) and MiniLM
(``{"text": ...}`` in), each with its signed pipeline, built by the fixtures of
test_agent_predict.py and test_agent_predict_audio_text.py. About 50 mutated bodies of each
content type (bytes flipped, cut or inserted, header fields rewritten, bombs, lone surrogates,
deep JSON) are posted; every answer is a 2xx, or a 4xx whose JSON error names the problem; the
agent stays up, still answers a good body after them, and its log holds no traceback.

The unit fuzz (tests/unit/test_pipeline_fuzz.py) explores far more inputs in process; this
checks the served path end to end (routing, admission, error mapping) with a bounded set."""

from __future__ import annotations

import io
import json
import struct
import wave
import zlib

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, make_device
from tests.integration.test_agent_predict import LABELS, PIPELINE_YAML, _installed, digits_convert_dir
from tests.integration.test_agent_predict_audio_text import (
    MINILM_IO,
    TEXT_PIPELINE,
    VAD_PIPELINE,
    _convert_dir,
    _spec,
    minilm,
    vad_onnx,
)

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
ort = pytest.importorskip("onnxruntime")
httpx = pytest.importorskip("httpx")

__all__ = ["digits_convert_dir", "minilm", "vad_onnx"]  # fixtures reused from the two predict tests
BODIES_PER_TYPE = 50


def _install(device, convert_dir, name: str, pipeline: str, **files) -> None:
    """Package in process (``edgesdk.toolchain.package``: no interpreter start) and install."""
    from edgesdk.toolchain import package

    (device.root / f"{name}.yaml").write_text(pipeline)
    bundle = device.root / f"{name}.edgepkg"
    package(
        convert_dir, out=bundle, name=name, version="1.0.0", release=1, publisher_key=device.publisher_key,
        recipients=device.device_pub, targets=[PROFILE], pipeline=device.root / f"{name}.yaml", **files,
    )  # fmt: skip
    _installed(device, bundle)


@pytest.fixture(scope="module")
def fuzz_agent(digits_convert_dir, minilm, vad_onnx, tmp_path_factory):
    """One agent serving ``digits`` (image), ``vad`` (audio) and ``minilm`` (text)."""
    root = tmp_path_factory.mktemp("agent-predict-fuzz")
    device = make_device(root / "device")
    (root / "digits.txt").write_text("\n".join(LABELS) + "\n")
    _install(device, digits_convert_dir, "digits", PIPELINE_YAML, labels=root / "digits.txt")
    folder, onnx = minilm
    ids = [_spec(n, "int64", ["batch", "sequence"]) for n in MINILM_IO]
    hidden = [_spec("last_hidden_state", "float32", ["batch", "sequence", 384])]
    text_dir = _convert_dir(root / "minilm", "minilm", onnx, ids, hidden)
    _install(device, text_dir, "minilm", TEXT_PIPELINE, tokenizer=folder / "tokenizer.json")
    vad_inputs = [
        _spec("input", "float32", ["batch", "samples"]), _spec("state", "float32", [2, "batch", 128]),
        _spec("sr", "int64", []),
    ]  # fmt: skip
    vad_outputs = [_spec("output", "float32", ["batch", 1]), _spec("stateN", "float32", [2, "batch", 128])]
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32)}
    feeds["sr"] = np.array(16000, np.int64)  # golden inputs of the pipeline's shapes, for the install check
    session = ort.InferenceSession(str(vad_onnx), providers=["CPUExecutionProvider"])
    golden = feeds | {f"output:{o.name}": value for o, value in zip(session.get_outputs(), session.run(None, feeds))}
    (root / "vad.txt").write_text("speech\n")
    vad_dir = _convert_dir(root / "vad", "vad", vad_onnx, vad_inputs, vad_outputs, golden)
    _install(device, vad_dir, "vad", VAD_PIPELINE, labels=root / "vad.txt")
    with AgentProcess(device) as running:
        yield running


def _image(fmt: str) -> bytes:
    pixels = np.random.default_rng(1).integers(0, 256, (32, 32), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def _wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes(np.random.default_rng(2).integers(-9000, 9000, (1600, 2), dtype="<i2").tobytes())
    return buffer.getvalue()


def _mutated(seed: bytes, rng: np.random.Generator, count: int) -> list[bytes]:
    """``count`` copies of ``seed`` with 1-4 bytes flipped, a cut or a few random bytes inserted,
    and random bytes; the first bytes (headers) are hit more often than the rest."""
    bodies = [bytes(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8))]
    while len(bodies) < count:
        data = bytearray(seed)
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(0, min(len(data), 64) if rng.random() < 0.6 else len(data)))
            action = rng.choice(["flip", "cut", "insert"], p=[0.6, 0.2, 0.2])
            if action == "flip":
                data[at] ^= int(rng.integers(1, 256))
            elif action == "cut":
                del data[at:]
                break
            else:
                data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        bodies.append(bytes(data))
    return bodies


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_bomb() -> bytes:
    """5000 x 5000 declared (over the digits pipeline's max_pixels) in a hundred bytes."""
    ihdr = struct.pack(">IIBBBBB", 5000, 5000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(bytes(64)))


def _cases(rng: np.random.Generator) -> list[tuple[str, str, bytes]]:
    """(model, Content-Type, body): about 50 bodies of each content type."""
    wav, png, jpeg = _wav(), _image("PNG"), _image("JPEG")
    wav_bomb = wav[:40] + struct.pack("<I", 2**32 - 1) + wav[44:]
    texts = [json.dumps({"text": "the agent answers raw text"}).encode()]
    texts += [b'{"text": "a \\ud800"}', b"[" * 100_000, b'{"text": ' * 5000, b'{"text": "\xff\xfe"}', b"plain words"]
    texts += [json.dumps({"text": "word " * 5000}).encode(), json.dumps({"text": ["a"]}).encode()]
    cases = [("vad", "audio/wav", body) for body in [wav_bomb, *_mutated(wav, rng, BODIES_PER_TYPE - 1)]]
    cases += [("digits", "image/png", body) for body in [_png_bomb(), *_mutated(png, rng, BODIES_PER_TYPE - 1)]]
    cases += [("digits", "image/jpeg", body) for body in _mutated(jpeg, rng, BODIES_PER_TYPE)]
    text_seed = texts[0]
    cases += [("minilm", "application/json", body) for body in texts + _mutated(text_seed, rng, BODIES_PER_TYPE - 8)]
    return cases


def test_mutated_bodies_to_predict_are_2xx_or_a_4xx_naming_the_problem(fuzz_agent) -> None:
    base = f"{fuzz_agent.url}/v1/models"
    answered: dict[int, int] = {}
    with httpx.Client(timeout=60) as client:
        for model, media, body in _cases(np.random.default_rng(42)):
            answer = client.post(f"{base}/{model}/predict", content=body, headers={"Content-Type": media})
            status = answer.status_code
            answered[status] = answered.get(status, 0) + 1
            assert 200 <= status < 300 or 400 <= status < 500, (model, media, body[:80], status, answer.text)
            if status >= 400:
                error = answer.json()["error"]
                assert isinstance(error, str) and len(error) > 10 and "internal" not in error, (model, body[:80], error)
        good = client.post(f"{base}/vad/predict", content=_wav(), headers={"Content-Type": "audio/wav"})
        assert good.status_code == 200 and good.json()["labels"][0]["label"] == "speech"
        text = client.post(f"{base}/minilm/predict", json={"text": "still answering"})
        assert text.status_code == 200 and len(text.json()["embedding"]) == 384
    assert fuzz_agent.proc.poll() is None, fuzz_agent.log()
    assert "Traceback" not in fuzz_agent.log(), fuzz_agent.log()[-3000:]
    assert answered.get(200, 0) >= 3 and sum(n for s, n in answered.items() if s >= 400) >= 50, answered
