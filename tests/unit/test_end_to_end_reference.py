"""The user's ``--reference`` of the end-to-end gate (converters/end_to_end.py): each bad one is
one clear UsageError line naming it; the usual answer shapes all read as one top-1 label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgesdk.converters.end_to_end import Expected, TaskCheck, expected_results, judge, load_reference, normalize

from edgesdk.errors import UsageError


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / "a.png", tmp_path / "b.jpg"]
    for path in paths:
        path.write_bytes(b"raw " + path.name.encode())
    return paths


def _module(tmp_path: Path, body: str) -> str:
    (tmp_path / "user_code.py").write_text(body)
    return str(tmp_path / "user_code.py")


@pytest.mark.parametrize(
    ("body", "attribute", "says"),
    [
        ("import no_such_package_here\n", "predict", "cannot import"),
        ("raise RuntimeError('needs MODEL_PATH')\n", "predict", "RuntimeError: needs MODEL_PATH"),
        ("LABELS = ['a']\n", "predict", "has no 'predict'"),
        ("LABELS = ['a']\n", "LABELS", "is a list, not a function"),
    ],
)
def test_a_bad_reference_is_one_line_naming_it(tmp_path: Path, body: str, attribute: str, says: str) -> None:
    spec = f"{_module(tmp_path, body)}:{attribute}"
    with pytest.raises(UsageError) as caught:
        load_reference(spec)
    message = str(caught.value)
    assert message.startswith(f"--reference {spec}") and says in message and "\n" not in message


def test_an_unimportable_module_name_is_one_line() -> None:
    with pytest.raises(UsageError, match=r"cannot import no_such_pkg\.mod \(ModuleNotFoundError"):
        load_reference("no_such_pkg.mod:predict")
    with pytest.raises(UsageError, match="MODULE:FUNCTION"):
        load_reference("just_a_name")


def test_a_reference_that_raises_names_the_file(tmp_path: Path, files: list[Path]) -> None:
    spec = _module(tmp_path, "def predict(path):\n    raise ValueError('cannot read ' + path)\n") + ":predict"
    with pytest.raises(UsageError, match=r"raised on a\.png: ValueError: cannot read .*a\.png"):
        expected_results(spec, files)


def test_a_reference_returning_no_label_says_what_to_return(tmp_path: Path, files: list[Path]) -> None:
    spec = _module(tmp_path, "def predict(path):\n    return None\n") + ":predict"
    with pytest.raises(UsageError, match=r"returned NoneType 'None' for a\.png; expected a label"):
        expected_results(spec, files)


def test_a_reference_annotated_bytes_gets_the_raw_bytes(tmp_path: Path, files: list[Path]) -> None:
    spec = _module(tmp_path, "def predict(data: bytes):\n    return data.decode()\n") + ":predict"
    assert [e.label for e in expected_results(spec, files)] == ["raw a.png", "raw b.jpg"]
    spec = _module(tmp_path, "def predict(path):\n    return path.rsplit('/', 1)[1]\n") + ":predict"
    assert [e.label for e in expected_results(spec, files)] == ["a.png", "b.jpg"]


def test_a_json_reference_must_name_every_file(tmp_path: Path, files: list[Path]) -> None:
    table = tmp_path / "expected.json"
    table.write_text(json.dumps({"a.png": "cat", "b.jpg": {"label": "dog", "score": 0.9}}))
    assert expected_results(str(table), files) == [Expected("cat"), Expected("dog", 0.9)]
    table.write_text(json.dumps({"a.png": "cat"}))
    with pytest.raises(UsageError, match=r"no label for b\.jpg \(1 file\(s\) missing\)"):
        expected_results(str(table), files)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("tabby", Expected("tabby")),
        (281, Expected("281")),
        (("tabby", 0.7), Expected("tabby", 0.7)),
        ([("tiger", 0.2), ("tabby", 0.7)], Expected("tabby", 0.7)),  # the best score, not the first
        ({"labels": [{"label": "tabby", "score": 0.7}]}, Expected("tabby", 0.7)),  # the agent's own answer
        (["tabby", "tiger"], Expected("tabby")),  # labels best first, no scores
    ],
)
def test_the_usual_answer_shapes_read_as_one_top1_label(answer: object, expected: Expected) -> None:
    assert normalize(answer, "--reference x returned", "a.png") == expected


def _check(files: list[Path], expected: list[Expected]) -> TaskCheck:
    from edgesdk.schemas.pipeline import Pipeline
    from edgesdk.schemas.report import EndToEndCheck

    pipeline = Pipeline.model_validate({"post": {"labels": ["cat", "dog"]}})
    summary = EndToEndCheck(images="x", files=len(files), reference="r", pipeline_sha256="0" * 64, gate=0.99)
    return TaskCheck(pipeline, files, expected, summary, gate=0.5, score_tolerance=0.05)


def _answer(label: str, index: int, score: float) -> dict[str, object]:
    return {"labels": [{"label": label, "index": index, "score": score}]}


def test_labels_that_agree_with_scores_far_apart_miss_the_gate_on_the_score_tail(files: list[Path]) -> None:
    check = _check(files, [Expected("cat", 0.9), Expected("dog", 0.8)])
    close = judge(check, [_answer("cat", 0, 0.89), _answer("dog", 1, 0.81)])
    assert close.passed and close.agreement == 1.0 and close.score_diff == pytest.approx(0.01)
    apart = judge(check, [_answer("cat", 0, 0.5), _answer("dog", 1, 0.81)])
    assert not apart.passed and apart.verdict == "fail" and apart.score_diff == pytest.approx(0.4)
    assert "worst sample 0.4000" in apart.note


def test_a_different_label_is_named_with_the_users(files: list[Path]) -> None:
    check = _check(files, [Expected("cat"), Expected("dog")])
    result = judge(check, [_answer("dog", 1, 0.7), _answer("dog", 1, 0.9)])
    assert result.agreement == 0.5 and result.disagreements == ["a.png: dog (yours cat)"]
    assert result.score_diff is None  # the user gave no scores: only labels are judged
