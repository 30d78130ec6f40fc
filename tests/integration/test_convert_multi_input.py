"""A transformer-like model with two int64 inputs (token ids, attention mask) and a dynamic
sequence axis, through ``edgesdk convert``: not only single-image CNNs."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from edgesdk.schemas.report import ConversionReport
from tests import agent_helpers

MODEL = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class TinyEncoder(nn.Module):
        """ids + mask -> 32-d embedding; attention written out so the sequence axis stays dynamic."""

        def __init__(self, vocab=1000, dim=32, heads=4):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(vocab, dim)
            self.position = nn.Parameter(torch.randn(128, dim) * 0.02)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm1 = nn.LayerNorm(dim)
            self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.norm2 = nn.LayerNorm(dim)
            self.heads = heads

        def forward(self, input_ids, attention_mask):
            x = self.embed(input_ids) + self.position[: input_ids.shape[1]]
            b, t, d = x.shape
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
            scores = scores + (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * -1e4
            x = self.norm1(x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)))
            x = self.norm2(x + self.ff(x))
            weights = attention_mask.to(x.dtype)[..., None]
            return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)


    def tiny_encoder():
        return TinyEncoder().eval()
    '''
)


def _tokens(count: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((count, length), np.int64)
    for row in range(count):
        mask[row, rng.integers(length // 3, length + 1) :] = 0
    return {"input_ids": rng.integers(1, 1000, (count, length)).astype(np.int64) * mask, "attention_mask": mask}


@pytest.fixture(scope="module")
def converted(digits, tmp_path_factory):  # digits: same "torch + sklearn installed" skip as the other tiers
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("text")
    (folder / "tiny_text.py").write_text(MODEL)
    np.savez(folder / "tokens.npz", **_tokens(48, 16, 0))  # type: ignore[arg-type]
    np.savez(folder / "held_out.npz", **_tokens(64, 16, 1))  # type: ignore[arg-type]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    out = folder / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", "tiny_text:tiny_encoder", "--profile", "rpi5-8gb",
         "--formats", "onnx,tflite", "--out", str(out), "--calibration", str(folder / "tokens.npz"),
         "--validation", str(folder / "held_out.npz"),
         "--output-names", "embedding", "--dynamic-axis", "input_ids:1:sequence",
         "--dynamic-axis", "attention_mask:1:sequence"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sys.path.insert(0, str(folder))
    try:
        import tiny_text

        model = tiny_text.tiny_encoder()
    finally:
        sys.path.remove(str(folder))
    return out, ConversionReport.model_validate_json((out / "report.json").read_text()), model


def test_int64_multi_input_model_ships_validated_variants(converted) -> None:
    out, report, _ = converted
    assert report.metric == "cosine"  # an embedding, not a classifier
    shipped = {v.id: v for v in report.variants}
    assert {"onnx-fp32", "onnx-fp16", "onnx-int8", "tflite-fp32"} <= set(shipped), report.rejected
    for variant in report.variants:
        assert variant.accuracy.passed and variant.accuracy.value >= 0.99
        assert [s.name for s in variant.inputs] == ["input_ids", "attention_mask"]
    onnx_inputs = shipped["onnx-fp32"].inputs
    assert all(s.dtype == "int64" and s.shape == ["batch", "sequence"] for s in onnx_inputs)
    # litert-torch has static shapes: a signature per sequence bucket, the inputs' length open.
    assert shipped["tflite-fp32"].inputs[0].shape == [1, None]
    assert "sequence buckets 8 and 16" in shipped["tflite-fp32"].measurements.note
    golden = np.load(out / "golden.npz")
    assert {"input_ids", "attention_mask", "output:embedding"} <= set(golden.files)


def test_a_transformer_gets_every_transformer_recipe_tried_and_reported(converted) -> None:
    _, report, _ = converted
    assert report.family == "transformer"
    assert any(d.startswith("model family transformer: transformer-like graph: attention") for d in report.decisions)
    onnx_int8 = {t.method: t for t in report.recipes if t.format.value == "onnx" and t.precision.value == "int8"}
    assert set(onnx_int8) == {
        "dynamic-int8-per-channel",
        "weight-only-int8",
        "static-qdq-weight-matmuls",
        "dynamic-int8",
    }
    assert [t.outcome for t in onnx_int8.values()].count("kept") == 1
    for trial in onnx_int8.values():
        # Each recipe was built and validated in onnxruntime (not just planned).
        assert trial.outcome != "failed", trial
        assert trial.accuracy is not None and trial.lower_bound is not None and trial.size and trial.latency_p50_ms
        assert trial.lower_bound <= trial.accuracy
    kept = next(t for t in onnx_int8.values() if t.outcome == "kept")
    assert kept.method == next(v for v in report.variants if v.id == "onnx-int8").quantization_method
    assert any(d == "calibration and validation data are disjoint (SHA-256 per sample)" for d in report.decisions)


def test_onnx_variants_keep_the_sequence_axis_dynamic(converted) -> None:
    import torch

    from edgesdk.runtimes import load_variant

    out, report, model = converted
    feeds = _tokens(3, 40, 1)  # a longer sequence than the export example
    with torch.no_grad():
        want = model(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))).numpy()
    for variant in report.variants:
        if variant.format.value != "onnx":
            continue
        loaded = load_variant("onnxruntime", {f: (out / f).read_bytes() for f in variant.files})
        got = loaded.run(feeds)["embedding"]
        cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        # The gate held at the calibration length (16); at 40 tokens int8 activations meet ranges
        # calibration never saw, and which int8 method ships is picked by measured speed, so int8
        # gets a looser bound here. The point of this test is that length 40 runs at all.
        floor = 0.95 if variant.precision.value == "int8" else 0.99
        assert cosine.min() > floor, (variant.id, cosine)


def test_full_integer_tflite_calibrates_on_int64_tokens(converted) -> None:
    # litert-torch makes the int64 token inputs int32; the calibration data stays int64 in the
    # .npz. Both int8 recipes must be built and measured (the full-integer one used to fail in
    # ai-edge-quantizer's calibration: "Got value of type INT64 but expected type INT32").
    _, report, _ = converted
    tflite_int8 = {t.method: t for t in report.recipes if t.format.value == "tflite" and t.precision.value == "int8"}
    assert set(tflite_int8) == {"static-int8-full-integer", "dynamic-int8"}
    for trial in tflite_int8.values():
        assert trial.outcome != "failed", trial
        assert trial.accuracy is not None and trial.size


def _torch_embedding(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(*(torch.from_numpy(feeds[k].astype(np.int64)) for k in ("input_ids", "attention_mask"))).numpy()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_tflite_buckets_serve_every_length_up_to_the_longest(converted) -> None:
    from edgesdk.errors import InferenceInputError
    from edgesdk.runtimes import load_variant

    out, report, model = converted
    for variant in report.variants:
        if variant.format.value != "tflite":
            continue
        loaded = load_variant("litert", {f.rsplit("/", 1)[-1]: (out / f).read_bytes() for f in variant.files})
        assert loaded.bucket_lengths == [8, 16] and loaded.sequence_axes == {"input_ids": 1, "attention_mask": 1}
        for length in (3, 8, 11, 16):  # the 8 bucket padded and exact, the serving signature padded and exact
            feeds = _tokens(1, length, length)
            feeds["attention_mask"][:] = 1
            feeds["input_ids"] = np.arange(1, length + 1, dtype=np.int64)[None] * 7
            got = loaded.run({k: v.astype(np.int32) for k, v in feeds.items()})["embedding"]
            floor = 0.95 if variant.precision.value == "int8" else 0.999
            assert _cosine(got[0], _torch_embedding(model, feeds)[0]) > floor, (variant.id, length)
        too_long = {k: np.ones((1, 17), np.int32) for k in ("input_ids", "attention_mask")}
        with pytest.raises(InferenceInputError, match="sequence of 17 is longer than this model's longest \\(16\\)"):
            loaded.run(too_long)
        loaded.close()


@pytest.mark.needs_agent_extra
def test_a_real_agent_serves_short_and_long_sentences_through_the_buckets(converted, tmp_path) -> None:
    httpx = pytest.importorskip("httpx")
    out, _, model = converted
    device = agent_helpers.make_device(tmp_path / "device")
    device.install(out, name="tiny")
    with agent_helpers.AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=60) as client:
        for length in (5, 12, 16):
            ids = (np.arange(length, dtype=np.int64)[None] * 13) % 999 + 1
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64)}
            response = client.post("/v1/models/tiny/infer", json={"inputs": {k: v.tolist() for k, v in feeds.items()}})
            assert response.status_code == 200, response.text
            assert response.headers["x-model-variant"].startswith("tflite-"), response.headers
            got = np.asarray(response.json()["outputs"]["embedding"], np.float32)
            assert _cosine(got[0], _torch_embedding(model, feeds)[0]) > 0.95, length
        too_long = {k: np.ones((1, 17), np.int64).tolist() for k in ("input_ids", "attention_mask")}
        refused = client.post("/v1/models/tiny/infer", json={"inputs": too_long})
        assert refused.status_code == 422 and "longer than this model's longest (16)" in refused.text, refused.text
        assert client.get("/healthz").status_code == 200  # still serving


def test_a_model_that_padding_changes_gets_no_buckets(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("litert_torch")
    from edgesdk.converters import convert

    class Unmasked(torch.nn.Module):
        """Mean over every position, padding included: zeros at the end change the answer."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(1000, 16)

        def forward(self, input_ids, attention_mask):
            return self.embed(input_ids).mean(1) * attention_mask[:, :1].to(torch.float32)

    report = convert(
        Unmasked().eval(), "rpi5-8gb", tmp_path / "out", calibration=_tokens(48, 32, 0), validation=_tokens(64, 32, 1),
        formats=["tflite"], precisions=["fp32"], output_names=["embedding"], name="unmasked",
        dynamic_axes={"input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}},
    )  # fmt: skip
    (variant,) = report.variants
    assert variant.inputs[0].shape == [1, 32] and variant.accuracy.passed
    assert "no buckets: zero padding changes this model's outputs" in variant.measurements.note


def test_a_model_that_refuses_a_shorter_sequence_gets_no_buckets(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("litert_torch")
    from edgesdk.converters import convert

    class FixedLength(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(1000, 16)

        def forward(self, input_ids, attention_mask):
            if input_ids.shape[1] != 32:
                raise ValueError(f"this model takes 32 tokens, got {input_ids.shape[1]}")
            weights = attention_mask.to(torch.float32)[..., None]
            return (self.embed(input_ids) * weights).sum(1)

    report = convert(
        FixedLength().eval(), "rpi5-8gb", tmp_path / "out", calibration=_tokens(48, 32, 0),
        validation=_tokens(64, 32, 1), formats=["tflite"], precisions=["fp32"], output_names=["embedding"],
        name="fixed", dynamic_axes={"input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}},
    )  # fmt: skip
    (variant,) = report.variants
    assert variant.inputs[0].shape == [1, 32] and variant.accuracy.passed
    assert "no buckets: the model did not run cut to 16 (ValueError: this model takes 32" in variant.measurements.note
