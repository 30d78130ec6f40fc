"""The field corpus's fast subset (issue 38): scripts/field-corpus itself, on two public models as
their wheels ship them (MediaPipe's iris landmarks .tflite: no SignatureDef, fp16 weights; RapidOCR's
paddle2onnx orientation classifier: Constant weights, ``-1`` dims) for a Pi Zero 2 W class profile.
Each row must ship its fp32 and carry every output's figure under the corpus's metric for it; a
second run reads the rows from the cache. The full corpus (all models × 3 profiles) is
docs/field-corpus.md, made by the same script.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from edgesdk.workloads.field_corpus import BY_NAME
from tests.conftest import assert_one_line_error

pytest.importorskip("ai_edge_litert", reason="the .tflite model is validated in LiteRT (edgesdk[litert])")
pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "field-corpus"
SUBSET = ["--models", "iris_landmark,ppocr_cls", "--profiles", "rpi-zero-2w", "--json"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def _wheels_or_skip(rows: list[dict]) -> None:
    missing = [r["reason"] for r in rows if r["reason"].startswith("wheel not found")]
    if missing:
        pytest.skip(missing[0])


def test_the_field_corpus_subset_ships_each_fp32_with_a_figure_per_output_and_reuses_its_cache(tmp_path) -> None:
    first = _run(*SUBSET, "--cache", str(tmp_path))
    assert first.returncode == 0, first.stderr
    rows = json.loads(first.stdout)["rows"]
    _wheels_or_skip(rows)
    assert [(r["model"], r["profile"]) for r in rows] == [
        ("iris_landmark", "rpi-zero-2w"),
        ("ppocr_cls", "rpi-zero-2w"),
    ]
    # Progress goes to stderr even when piped: the corpus's steps and convert's own.
    assert "[1/2] iris_landmark for rpi-zero-2w" in first.stderr
    assert "reading the model" in first.stderr
    for row in rows:
        shipped = {v["id"]: v for v in row["shipped"]}
        fp32 = next((v for i, v in shipped.items() if i.endswith("-fp32")), None)
        assert fp32 is not None, (row["model"], row["reason"], row.get("rejected"))
        wanted = {out: spec.split(":")[0] for out, spec in BY_NAME[row["model"]].metrics.items()}
        for variant in shipped.values():
            got = {a["output"]: a["metric"] for a in variant["outputs"]}
            assert got == wanted, (row["model"], variant["id"], got)
            assert all(a["passed"] for a in variant["outputs"]), variant
        # Each dropped variant is named by its id: a bare "fp16: ..." hid which format's fp16 missed.
        assert row["rejected"], row
        for reason in row["rejected"]:
            assert re.match(r"(onnx|tflite|openvino|coreml)-(fp32|fp16|bf16|int8|int4): ", reason), reason
        assert not row["cached"]
    second = _run(*SUBSET, "--cache", str(tmp_path))
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)["rows"]
    assert all(r["cached"] for r in again)
    assert [r["shipped"] for r in again] == [r["shipped"] for r in rows]


def test_the_field_corpus_names_an_unknown_model_and_the_known_ones_in_one_line() -> None:
    proc = _run("--models", "iris_landmark,resnet9000")
    assert_one_line_error(proc, "'resnet9000'", "--models", "ppocr_cls")
