"""The end-to-end gate's task-level figures (edgesdk/pipeline/compare.py, converters/task_results.py)
on hand-made answers: boxes matched per class, masks, decoded text and embeddings, each gate
reading the worst file with the mean beside it, so one bad file fails a gate the mean passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters.end_to_end import judge, prepare_task_check
from edgesdk.converters.html_report import render_html
from edgesdk.converters.task_results import answer_of, judge_task, parse_task_gates

from edgesdk.errors import UsageError
from edgesdk.pipeline.compare import char_error_rate, mask_iou, match_boxes
from edgesdk.schemas.pipeline import Pipeline

FILES = [Path(f"file-{i:02d}.png") for i in range(20)]


def _box(index: int, x: float, y: float = 10.0, side: float = 20.0) -> dict[str, object]:
    return {"index": index, "box": [x, y, x + side, y + side]}


def test_a_box_shifted_so_its_iou_drops_under_the_gate_fails_it_though_the_mean_passes() -> None:
    theirs = [{"boxes": [_box(0, 10), _box(1, 60)]} for _ in FILES]
    ours = [{"boxes": [_box(0, 10), _box(1, 60)]} for _ in FILES]
    ours[7] = {"boxes": [_box(0, 14), _box(1, 60)]}  # 4 px of 20: IoU 16/24 = 0.667, matched (≥ 0.5)
    result = judge_task("boxes", parse_task_gates("boxes", None), FILES, ours, theirs)
    figures = {f.name: f for f in result.figures}
    assert figures["box_iou"].value == pytest.approx(16 / 24, abs=1e-6) and figures["box_iou"].mean > 0.98
    assert not figures["box_iou"].passed and figures["box_iou"].worst == "file-07.png"
    assert figures["recall"].passed and figures["precision"].passed
    assert not result.passed and result.disagreements == ["file-07.png: box_iou 0.6667 (gate 0.8)"]
    relaxed = judge_task("boxes", parse_task_gates("boxes", ["box_iou=0.6"]), FILES, ours, theirs)
    assert relaxed.passed


def test_a_box_moved_off_its_match_or_of_another_class_costs_recall_and_precision() -> None:
    match = match_boxes([_box(0, 30)], [_box(0, 10)])  # IoU 10/30: below the 0.5 at which boxes match
    assert (match.recall, match.precision, match.ious) == (0.0, 0.0, ())
    other_class = match_boxes([_box(1, 10)], [_box(0, 10)])
    assert other_class.recall == 0.0 and other_class.precision == 0.0
    extra = match_boxes([_box(0, 10), _box(0, 100)], [_box(0, 10)])
    assert extra.recall == 1.0 and extra.precision == 0.5 and extra.ious == (1.0,)
    # Greedy by IoU, best first: the reference's exact box goes to our exact box, not the first one seen.
    greedy = match_boxes([_box(0, 15), _box(0, 10)], [_box(0, 10), _box(0, 16)])
    assert greedy.recall == 1.0 and min(greedy.ious) == pytest.approx(19 / 21)
    assert match_boxes([], []).recall == 1.0 and match_boxes([], [_box(0, 1)]).recall == 0.0


def test_one_bad_line_among_good_ones_fails_the_text_gate_though_the_mean_passes() -> None:
    theirs = [{"text": "edge devices read text"} for _ in FILES]
    ours = [dict(t) for t in theirs]
    ours[3] = {"text": "edge dev1ces rea text"}  # 2 edits of 22 characters
    result = judge_task("ctc", parse_task_gates("ctc", None), FILES, ours, theirs)
    exact, cer = result.figures
    assert exact.name == "exact" and exact.value == 0.95 and exact.passed  # 19 of 20 exact: above 0.9
    assert cer.value == pytest.approx(2 / 22) and cer.passed  # under the default 0.1
    ours[3] = {"text": "edge dev1ces r3a tx"}
    failed = judge_task("ctc", parse_task_gates("ctc", None), FILES, ours, theirs)
    cer = failed.figures[1]
    assert cer.mean < 0.1 < cer.value and not cer.passed and not failed.passed
    assert failed.disagreements[0].startswith("file-03.png: cer")
    assert char_error_rate("kitten", "sitting") == pytest.approx(3 / 7) and char_error_rate("", "") == 0.0


def test_a_mask_gate_reads_the_worst_image_and_a_named_percentile_when_asked() -> None:
    base = np.zeros((8, 8), np.uint8)
    base[2:6, 2:6] = 1
    theirs = [{"mask": base} for _ in FILES]
    ours = [{"mask": base.copy()} for _ in FILES]
    ours[0]["mask"][2:6, 2:4] = 0  # half the object lost: IoU of class 1 is 8/16, of the background 48/56
    assert mask_iou(ours[0]["mask"], base) == pytest.approx((8 / 16 + 48 / 56) / 2)
    worst = judge_task("mask", parse_task_gates("mask", None), FILES, ours, theirs)
    assert not worst.passed and worst.figures[0].value == pytest.approx(0.678571) and worst.figures[0].mean > 0.98
    tail = judge_task("mask", parse_task_gates("mask", ["mask_iou=0.9@p10"]), FILES, ours, theirs)
    assert tail.passed and tail.figures[0].statistic == "p10" and tail.figures[0].value == 1.0


def test_an_embedding_gate_reads_the_worst_cosine_with_the_mean_beside_it() -> None:
    rng = np.random.default_rng(0)
    theirs = [{"embedding": rng.normal(size=16)} for _ in FILES]
    ours = [{"embedding": t["embedding"] + rng.normal(scale=1e-3, size=16)} for t in theirs]
    assert judge_task("embedding", parse_task_gates("embedding", None), FILES, ours, theirs).passed
    ours[5] = {"embedding": -theirs[5]["embedding"]}
    result = judge_task("embedding", parse_task_gates("embedding", None), FILES, ours, theirs)
    (cosine,) = result.figures
    assert cosine.value == pytest.approx(-1.0) and cosine.mean > 0.89 and cosine.worst == "file-05.png"
    assert not result.passed and result.agreement == 0.95


@pytest.mark.parametrize(
    ("kind", "given", "says"),
    [
        ("boxes", "0.9", "a boxes result has several gates; name one: recall, precision, box_iou, match_iou=VALUE"),
        ("ctc", "cosine=0.9", "'cosine' is not a gate of a ctc result; its gates: exact, cer"),
        ("mask", "mask_iou=high", "give NAME=VALUE or NAME=VALUE@pN"),
        ("mask", "mask_iou=1.5", "must be in (0, 1]"),
        ("ctc", "cer=-0.1", "cer is an error rate, at least 0"),
        ("ctc", "exact=0.9@p5", "@pN names a percentile in (0, 100) of a per-file figure"),
        ("classes", "top1=0", "must be a share of files in (0, 1]"),
    ],
)
def test_a_bad_task_gate_is_one_line_naming_it(kind: str, given: str, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_task_gates(kind, [given])
    message = str(caught.value)
    assert message.startswith(f"--task-gate {given}: ") and says in message and "\n" not in message


def test_the_users_answers_read_in_each_kinds_shape_and_a_wrong_one_says_what_to_return() -> None:
    labels = ["cat", "dog"]
    boxes = answer_of("boxes", [{"label": "dog", "box": [1, 2, 3, 4]}], "said", "a.png", labels)
    assert boxes == {"boxes": [{"index": 1, "box": [1.0, 2.0, 3.0, 4.0]}]}
    assert answer_of("ctc", {"text": "hi"}, "said", "a.png", None) == {"text": "hi"}
    assert answer_of("mask", [[0, 1], [1, 1]], "said", "a.png", None)["mask"].shape == (2, 2)
    assert answer_of("embedding", [[0.5, 0.5]], "said", "a.png", None)["embedding"].shape == (2,)
    with pytest.raises(UsageError, match=r"^said str 'oops' for a\.png; expected \{'boxes'"):
        answer_of("boxes", "oops", "said", "a.png", labels)
    with pytest.raises(UsageError, match=r"expected an \(H, W\) array of class indices"):
        answer_of("mask", [0.5, 0.5], "said", "a.png", None)
    with pytest.raises(UsageError, match=r"expected \{'boxes'"):
        answer_of("boxes", [{"label": "cat", "box": [1, 2, 3]}], "said", "a.png", labels)
    with pytest.raises(UsageError, match=r"expected a vector"):
        answer_of("embedding", [0.5, float("nan")], "said", "a.png", None)


def test_a_text_pipeline_reads_txt_files_and_its_json_reference_into_the_report(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "ignored.png"):
        (folder / name).write_text("some text")
    (tmp_path / "ref.json").write_text(json.dumps({"a.txt": [1.0, 0.0], "b.txt": {"embedding": [0.0, 1.0]}}))
    pipeline = Pipeline.model_validate(
        {"input": "text", "text": {"tokenizer": "{}"}, "post": {"kind": "embedding", "pool": "none"}}
    )
    check = prepare_task_check(pipeline, folder, str(tmp_path / "ref.json"), ["cosine=0.95"])
    assert [p.name for p in check.files] == ["a.txt", "b.txt"]
    assert check.summary.kind == "embedding" and check.summary.gates == {"cosine": 0.95}
    task = judge(check, [{"embedding": [1.0, 0.0]}, {"embedding": [0.6, 0.8]}])
    assert not task.passed and task.figures[0].value == pytest.approx(0.8) and task.figures[0].worst == "b.txt"
    assert "task cosine worst sample 0.8000 (mean 0.9000) vs gate ≥ 0.95, 2 files" == task.note
    page = render_html(_report_with(task))
    assert "End to end: task results against yours" in page and "<svg" in page and "b.txt" in page


def _report_with(task: object):
    from datetime import datetime, timezone

    from edgesdk.schemas.manifest import AccuracyResult, TensorSpec
    from edgesdk.schemas.report import ConversionReport, ShippedVariant

    spec = TensorSpec(name="x", dtype="float32", shape=[1, 2])
    variant = ShippedVariant(
        id="onnx-fp32", format="onnx", precision="fp32", runtime="onnxruntime", files=["m.onnx"], size=1,
        inputs=[spec], outputs=[spec], task_accuracy=task,
        accuracy=AccuracyResult(metric="cosine", value=1.0, gate=0.99, passed=True, samples=1),
    )  # fmt: skip
    return ConversionReport(
        model_name="m", source="s", profile="p", created=datetime.now(timezone.utc), metric="cosine", gate=0.99,
        variants=[variant],
    )  # fmt: skip


def test_convert_names_a_bad_task_gate_in_one_line_before_converting(tmp_path: Path, capsys) -> None:
    from edgesdk.cli.main import cli
    from edgesdk.console import run_cli

    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_bytes(b"not read: the gate is checked first")
    (tmp_path / "pipeline.yaml").write_text("post: {kind: boxes}\n")
    (tmp_path / "ref.json").write_text("{}")
    argv = [
        "convert", str(tmp_path / "missing.onnx"), "--profile", "rpi5-8gb", "--out", str(tmp_path / "out"),
        "--pipeline", str(tmp_path / "pipeline.yaml"), "--validation-images", str(tmp_path / "photos"),
        "--reference", str(tmp_path / "ref.json"), "--task-gate", "recall=0.8", "--task-gate", "0.9",
    ]  # fmt: skip
    assert run_cli(cli, argv) == 1
    error = capsys.readouterr().err.strip()
    assert (
        error
        == (
            "error: --task-gate 0.9: a boxes result has several gates; "
            "name one: recall, precision, box_iou, match_iou=VALUE"
        )
        and not (tmp_path / "out").exists()
    )


def test_convert_reads_a_ctc_pipelines_vocabulary_and_package_checks_it_with_the_pipeline(
    tmp_path: Path, capsys
) -> None:
    from edgesdk.converters.end_to_end import pipeline_sha256

    from edgesdk.cli.main import cli
    from edgesdk.cli.package_cmd import _same_pipeline_as_validated
    from edgesdk.console import run_cli
    from edgesdk.schemas.pipeline import load_pipeline

    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "a.png").write_bytes(b"not read")
    (tmp_path / "pipeline.yaml").write_text("post: {kind: ctc}\n")
    (tmp_path / "vocabulary.txt").write_text("blank\na\nb\n")
    argv = [
        "convert", "m.onnx", "--profile", "rpi5-8gb", "--out", str(tmp_path / "out"), "--pipeline",
        str(tmp_path / "pipeline.yaml"), "--validation-images", str(tmp_path / "lines"), "--reference", "r.json",
    ]  # fmt: skip
    assert run_cli(cli, argv) == 1
    assert "a ctc post step needs its vocabulary" in capsys.readouterr().err
    assert run_cli(cli, [*argv, "--vocabulary", str(tmp_path / "vocabulary.txt"), "--task-gate", "0.5"]) == 1
    assert "--task-gate 0.5: a ctc result has several gates" in capsys.readouterr().err  # read past the vocabulary
    validated = load_pipeline(tmp_path / "pipeline.yaml", vocabulary=tmp_path / "vocabulary.txt")
    report = _report_with(None).model_copy(update={"end_to_end": _end_to_end(pipeline_sha256(validated))})
    (tmp_path / "report.json").write_text(report.model_dump_json())
    _same_pipeline_as_validated(tmp_path, tmp_path / "pipeline.yaml", None, None, tmp_path / "vocabulary.txt")
    (tmp_path / "other.txt").write_text("blank\nb\na\n")
    with pytest.raises(UsageError, match="is not the pipeline"):
        _same_pipeline_as_validated(tmp_path, tmp_path / "pipeline.yaml", None, None, tmp_path / "other.txt")


def _end_to_end(sha256: str):
    from edgesdk.schemas.report import EndToEndCheck

    return EndToEndCheck(images="lines", files=1, reference="r.json", pipeline_sha256=sha256, gate=1.0, kind="ctc")


def test_a_post_kind_without_task_figures_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.wav").write_bytes(b"not read")
    pipeline = Pipeline.model_validate({"input": "audio", "post": {"kind": "detection", "threshold": 0.5}})
    with pytest.raises(UsageError) as caught:
        prepare_task_check(pipeline, tmp_path, "r.json")
    assert str(caught.value) == (
        "--reference: a 'detection' post is not gated end to end yet (gated: classes, boxes, mask, ctc, embedding)"
    )
