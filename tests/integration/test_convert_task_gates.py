"""``convert --pipeline --validation-images --reference`` for boxes, masks, text and embeddings:
each real conversion runs every variant through the bundle's pipeline on the user's raw files
and gates it on the task result their own code gives (decoded text, a text-region mask, an
embedding, boxes), the tail of each figure with its mean, in report.json and report.html.

Models: RapidOCR's PP-OCRv4 recognizer (greedy CTC over its own 6,623-character dictionary,
read from the model's metadata) and detector (a one-channel text probability map: a mask), the
MiniLM text encoder (its last hidden state, mean-pooled), all already used by the suite; the
suite has no detector whose output the box decode reads (MediaPipe's face detector answers
anchor offsets), so the boxes case converts a small hand-built one (a strided conv: cxcywh
boxes around a 4 x 4 anchor grid and two sigmoid classes, as YOLOv8 exports lay them out).
The users' functions are written the usual way: Pillow or tokenizers, numpy, onnxruntime.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, agent_env
from tests.integration.test_agent_predict_audio_text import minilm  # noqa: F401 - the fixture, reused
from tests.prebuilt_models import RAPIDOCR, extract

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
ort = pytest.importorskip("onnxruntime")

OCR_WORDS = ["EDGE 2026", "model 42", "hello", "OCR test", "pipeline", "abc 123", "Raspberry", "signed"]
OCR_READER = '''\
"""My OCR step: the line resized to 48 x 320, (x / 255 - 0.5) / 0.5, greedy CTC."""
import json, os
import numpy as np, onnxruntime as ort
from PIL import Image

VOCABULARY = json.loads(open(os.environ["OCR_PIPELINE"], encoding="utf-8").read())["post"]["vocabulary"]
SESSION = ort.InferenceSession(os.environ["OCR_ONNX"], providers=["CPUExecutionProvider"])


def read_line(path):
    pixels = np.asarray(Image.open(path).convert("RGB").resize((320, 48), Image.Resampling.BILINEAR), np.float32)
    steps = SESSION.run(None, {"x": ((pixels / 255 - 0.5) / 0.5).transpose(2, 0, 1)[None]})[0][0].argmax(1)
    kept = np.concatenate([[True], steps[1:] != steps[:-1]])
    return "".join(VOCABULARY[i] for i in steps[kept] if i != 0)
'''
TEXT_REGIONS = '''\
"""My text-region mask: ImageNet mean/std at 160 x 160, the probability map cut at 0.3."""
import os
import numpy as np, onnxruntime as ort
from PIL import Image

SESSION = ort.InferenceSession(os.environ["DET_ONNX"], providers=["CPUExecutionProvider"])
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def text_regions(path):
    pixels = np.asarray(Image.open(path).convert("RGB").resize((160, 160), Image.Resampling.BILINEAR), np.float32)
    x = ((pixels / 255 - MEAN) / STD).transpose(2, 0, 1)[None]
    return (SESSION.run(None, {"x": x})[0][0, 0] >= 0.3).astype(np.uint8)
'''
EMBEDDER = '''\
"""My sentence embedding: tokenizers, the encoder's hidden state mean-pooled over the real tokens."""
import os
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

SESSION = ort.InferenceSession(os.environ["MINILM_ONNX"], providers=["CPUExecutionProvider"])
TOKENIZER = Tokenizer.from_file(os.environ["MINILM_TOKENIZER"])
NAMES = ("input_ids", "attention_mask", "token_type_ids")


def embed(path):
    tokens = TOKENIZER.encode(open(path, encoding="utf-8").read())
    values = (tokens.ids, tokens.attention_mask, tokens.type_ids)
    hidden = SESSION.run(None, {n: np.array([v], np.int64) for n, v in zip(NAMES, values)})[0][0]
    weights = np.array(tokens.attention_mask, np.float32)[:, None]
    vector = (hidden * weights).sum(axis=0) / weights.sum()
    return vector / np.linalg.norm(vector)
'''
DETECTOR = '''\
"""My detector's post-processing: cxcywh rows, score >= 0.5, greedy NMS per class at IoU 0.45."""
import os
import numpy as np, onnxruntime as ort
from PIL import Image

SESSION = ort.InferenceSession(os.environ["BOX_ONNX"], providers=["CPUExecutionProvider"])


def iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union


def detect(path):
    x = (np.asarray(Image.open(path).convert("RGB"), np.float32) / 255).transpose(2, 0, 1)[None]
    rows = SESSION.run(None, {"x": x})[0][0].T
    found = []
    for row in sorted(rows, key=lambda r: -r[4:].max()):
        klass, score = int(row[4:].argmax()), float(row[4:].max())
        box = [row[0] - row[2] / 2, row[1] - row[3] / 2, row[0] + row[2] / 2, row[1] + row[3] / 2]
        if score >= 0.5 and all(f["index"] != klass or iou(f["box"], box) <= 0.45 for f in found):
            found.append({"index": klass, "box": box})
    return found
'''


def _convert(model: Path, pipeline: dict[str, Any], files: Path, reference: str, root: Path, **options: Any) -> Any:
    """The conversion, in process (edgesdk.toolchain: the CLI's own path), onnx fp32, gated end to end
    on ``files``; its validation .npz holds the same files through the same pipeline."""
    from edgesdk.converters.end_to_end import MEDIA_TYPES, prepare_task_check

    from edgesdk.pipeline import preprocess
    from edgesdk.schemas.pipeline import load_pipeline
    from edgesdk.toolchain import convert

    (root / "pipeline.json").write_text(json.dumps(pipeline, ensure_ascii=False), encoding="utf-8")
    check = prepare_task_check(load_pipeline(root / "pipeline.json"), files, reference, options.pop("gates", None))
    validation = options.pop("validation", None)
    if validation is None:
        spec = _Spec("x", "float32", options.pop("shape"))
        feeds = [preprocess(check.pipeline, p.read_bytes(), MEDIA_TYPES[p.suffix], [spec])["x"] for p in check.files]
        validation = {"x": np.concatenate(feeds)}
    return convert(
        str(model), PROFILE, out=root / "out", validation=validation, formats="onnx", precisions="fp32",
        end_to_end=check, **options,
    )  # fmt: skip


class _Spec:
    def __init__(self, name: str, dtype: str, shape: list[int]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape


def _task(report: Any) -> Any:
    (variant,) = report.variants
    assert variant.accuracy is not None and variant.accuracy.passed  # the tensor gate, beside the task's
    return variant.task_accuracy


def _page(root: Path) -> str:
    return (root / "out" / "report.html").read_text(encoding="utf-8")


def test_an_ocr_recognizer_is_gated_on_the_users_decoded_text(tmp_path: Path, monkeypatch) -> None:
    import onnx
    from PIL import ImageDraw, ImageFont

    from edgesdk.errors import AccuracyGateError

    model = extract(RAPIDOCR, "ch_PP-OCRv4_rec_infer.onnx", tmp_path)
    metadata = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    vocabulary = ["blank", *metadata["character"].splitlines(), " "]  # as RapidOCR reads its dictionary
    lines = tmp_path / "lines"
    lines.mkdir()
    font = ImageFont.load_default(size=28)
    for i, word in enumerate(OCR_WORDS):
        picture = Image.new("RGB", (320, 48), "white")
        ImageDraw.Draw(picture).text((8, 8), word, fill="black", font=font)
        picture.save(lines / f"line-{i}.png")
    (tmp_path / "ocr.py").write_text(OCR_READER)
    monkeypatch.setenv("OCR_PIPELINE", str(tmp_path / "pipeline.json"))
    monkeypatch.setenv("OCR_ONNX", str(model))
    image = {"resize": {"height": 48, "width": 320}, "scale": 1 / 255, "mean": [0.5], "std": [0.5]}
    pipeline = {"image": image, "post": {"kind": "ctc", "vocabulary": vocabulary}}
    reference = f"{tmp_path / 'ocr.py'}:read_line"
    task = _task(_convert(model, pipeline, lines, reference, tmp_path, shape=[1, 3, 48, 320]))
    assert task.metric == "ctc" and task.passed and task.samples == len(OCR_WORDS)
    exact, cer = task.figures
    assert (exact.name, exact.value, exact.statistic) == ("exact", 1.0, "share of samples")
    assert (cer.name, cer.value, cer.mean, cer.statistic, cer.gate) == ("cer", 0.0, 0.0, "worst sample", 0.1)
    assert "<td>cer</td>" in _page(tmp_path) and "<svg" in _page(tmp_path)
    # The same model behind a pipeline that skips the user's (x - 0.5) / 0.5 reads other text: nothing ships.
    (tmp_path / "out").rename(tmp_path / "passed")
    unnormalized = {"image": {**image, "mean": [0.0], "std": [1.0]}, "post": pipeline["post"]}
    with pytest.raises(AccuracyGateError) as caught:
        _convert(model, unnormalized, lines, reference, tmp_path, shape=[1, 3, 48, 320])
    assert "fp32 dropped end to end: task exact share of samples" in str(caught.value), caught.value
    assert "vs gate ≤ 0.1, 8 files (line-" in str(caught.value)


def test_a_text_detectors_probability_map_is_gated_on_mask_iou(tmp_path: Path, monkeypatch) -> None:
    from PIL import ImageDraw, ImageFont

    model = extract(RAPIDOCR, "ch_PP-OCRv4_det_infer.onnx", tmp_path)
    pages = tmp_path / "pages"
    pages.mkdir()
    font, rng = ImageFont.load_default(size=18), np.random.default_rng(0)
    for i in range(8):
        picture = Image.new("RGB", (160, 160), "white")
        for row, word in enumerate(np.roll(["edge sdk", "mask 42", "hello"], i)):
            ImageDraw.Draw(picture).text((int(rng.integers(4, 40)), 10 + row * 50), word, fill="black", font=font)
        picture.save(pages / f"page-{i}.png")
    (tmp_path / "regions.py").write_text(TEXT_REGIONS)
    monkeypatch.setenv("DET_ONNX", str(model))
    image = {"resize": {"height": 160, "width": 160}, "scale": 1 / 255}
    image |= {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    pipeline = {"image": image, "post": {"kind": "mask", "threshold": 0.3}}  # one channel: text where p ≥ 0.3
    reference = f"{tmp_path / 'regions.py'}:text_regions"
    task = _task(_convert(model, pipeline, pages, reference, tmp_path, shape=[1, 3, 160, 160]))
    (mask_iou,) = task.figures
    assert task.metric == "mask" and task.passed and mask_iou.name == "mask_iou" and mask_iou.value == 1.0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["end_to_end"]["kind"] == "mask" and report["end_to_end"]["gates"] == {"mask_iou": 0.9}


def test_a_text_encoder_is_gated_on_the_worst_cosine_of_its_embeddings(
    minilm,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch,
) -> None:
    pytest.importorskip("tokenizers", reason="the text pipeline needs tokenizers (pip install 'edgesdk[pipeline]')")
    from edgesdk.workloads.text_encoder import tokenize

    folder, model = minilm  # the suite's cached export of its last hidden state
    tokenizer = folder / "tokenizer.json"
    sentences = [
        "The agent answers raw text.", "A microphone does not produce tensors.", "Silero detects speech.",
        "Boxes, masks and text are gated too.", "The worst file decides.", "Edge devices run models offline.",
    ]  # fmt: skip
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, sentence in enumerate(sentences):
        (texts / f"sentence-{i}.txt").write_text(sentence)
    (tmp_path / "embed.py").write_text(EMBEDDER)
    monkeypatch.setenv("MINILM_ONNX", str(model))
    monkeypatch.setenv("MINILM_TOKENIZER", str(tokenizer))
    pipeline = {
        "input": "text", "text": {"tokenizer": tokenizer.read_text(), "max_length": 32},
        "post": {"kind": "embedding", "pool": "mean", "normalize": True},
    }  # fmt: skip
    reference = f"{tmp_path / 'embed.py'}:embed"
    report = _convert(
        model, pipeline, texts, reference, tmp_path, validation=tokenize(sentences), gates=["cosine=0.999"]
    )
    task = _task(report)
    (cosine,) = task.figures
    assert task.metric == "embedding" and task.passed and cosine.gate == 0.999
    assert cosine.value > 0.9999 and cosine.statistic == "worst sample" and cosine.samples == len(sentences)
    assert report.end_to_end.gates == {"cosine": 0.999}


def _tiny_detector(path: Path, classes: int = 2) -> Path:
    """x (N, 3, 32, 32) → (N, 4 + classes, 16): an 8 x 8 strided conv; boxes are anchors (cell centres,
    12 px) moved by 4 tanh(conv) px, class scores sigmoid(conv)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    centres = np.arange(4, 32, 8, dtype=np.float32)
    cy, cx = np.meshgrid(centres, centres, indexing="ij")
    inits = {
        "w": (rng.standard_normal((4 + classes, 3, 8, 8)) * 0.15).astype(np.float32),
        "b": np.zeros(4 + classes, np.float32),
        "shape": np.array([0, 4 + classes, 16], np.int64),
        "split": np.array([4, classes], np.int64),
        "four": np.array(4.0, np.float32),
        "anchors": np.stack([cx.ravel(), cy.ravel(), np.full(16, 12.0), np.full(16, 12.0)])[None].astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[8, 8]),
        helper.make_node("Reshape", ["c", "shape"], ["rows"]),
        helper.make_node("Split", ["rows", "split"], ["raw_box", "raw_cls"], axis=1),
        helper.make_node("Tanh", ["raw_box"], ["t"]),
        helper.make_node("Mul", ["t", "four"], ["offset"]),
        helper.make_node("Add", ["offset", "anchors"], ["box"]),
        helper.make_node("Sigmoid", ["raw_cls"], ["cls"]),
        helper.make_node("Concat", ["box", "cls"], ["out"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4 + classes, 16])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_detector_is_gated_on_box_recall_precision_and_iou_and_a_lower_score_cut_ships_nothing(
    tmp_path: Path,
) -> None:
    model = _tiny_detector(tmp_path / "detector.onnx")
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (14, 32, 32, 3), dtype=np.uint8)
    for i, picture in enumerate(pixels[:8]):
        Image.fromarray(picture).save(photos / f"photo-{i}.png")
    np.savez(tmp_path / "validation.npz", x=(pixels[8:] / 255).astype(np.float32).transpose(0, 3, 1, 2))
    (tmp_path / "detect.py").write_text(DETECTOR)
    boxes = {"format": "cxcywh", "transposed": True, "score_threshold": 0.5, "iou_threshold": 0.45}
    for name, cut in (("pipeline.yaml", 0.5), ("lower_cut.yaml", 0.3)):
        post = {"kind": "boxes", "labels": ["cat", "dog"], "boxes": boxes | {"score_threshold": cut}}
        (tmp_path / name).write_text(json.dumps({"image": {"scale": 1 / 255}, "post": post}))
    env = {**agent_env(), "BOX_ONNX": str(model)}

    def convert(pipeline: str, out: str, *gates: str) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable, "-m", "edgesdk.cli.main", "convert", str(model), "--profile", PROFILE, "--formats", "onnx",
            "--precisions", "fp32", "--out", str(tmp_path / out), "--validation", str(tmp_path / "validation.npz"),
            "--pipeline", str(tmp_path / pipeline), "--validation-images", str(photos),
            "--reference", f"{tmp_path / 'detect.py'}:detect", *gates,
        ]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    passed = convert("pipeline.yaml", "out", "--task-gate", "box_iou=0.95")
    assert passed.returncode == 0, passed.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    figures = {f["name"]: f for f in report["variants"][0]["task_accuracy"]["figures"]}
    assert {n: (f["value"], f["passed"]) for n, f in figures.items()} == {
        "recall": (1.0, True), "precision": (1.0, True), "box_iou": (pytest.approx(1.0, abs=1e-5), True),
    }  # fmt: skip
    assert figures["box_iou"]["gate"] == 0.95 and "onnx-fp32 end to end: task recall worst sample" in passed.stdout
    assert "recall 1.0000, precision 1.0000, box_iou 1.0000 (pass)" in passed.stdout  # the table's cell
    # A pipeline cutting scores at 0.3 where the user's code cuts at 0.5 answers extra boxes: precision drops.
    lower = convert("lower_cut.yaml", "lower")
    assert lower.returncode != 0 and "Traceback" not in lower.stderr, lower.stderr[-3000:]
    line = lower.stderr.strip().splitlines()[-1]
    assert "fp32 dropped end to end: task recall worst sample 1.0000" in line, line
    assert "precision worst sample" in line and ": precision 0." in line and not (tmp_path / "lower").exists()
