"""The pipeline's box, CTC and embedding post steps and its task-level comparison, each against a
reference written the slow, obvious way (a brute-force per-class NMS in pure Python, a loop CTC)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import SchemaError, UsageError
from edgesdk.pipeline import PipelineInputError, compare_results, postprocess
from edgesdk.schemas.pipeline import Pipeline


def _iou(a: list[float], b: list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _brute_force_nms(
    rows: np.ndarray, threshold: float, iou: float, limit: int
) -> list[tuple[int, float, list[float]]]:
    candidates = []
    for row in rows.tolist():
        cx, cy, w, h, *scores = row
        best = max(range(len(scores)), key=lambda c: scores[c])
        if scores[best] >= threshold:
            candidates.append((best, scores[best], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]))
    kept = []
    for klass in sorted({c[0] for c in candidates}):
        mine = sorted((c for c in candidates if c[0] == klass), key=lambda c: -c[1])
        chosen: list[tuple[int, float, list[float]]] = []
        for candidate in mine:
            if all(_iou(candidate[2], other[2]) <= iou for other in chosen):
                chosen.append(candidate)
        kept += chosen
    return sorted(kept, key=lambda c: -c[1])[:limit]


@pytest.mark.parametrize("seed", range(4))
def test_box_decoding_and_class_aware_nms_match_a_brute_force_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count, classes = 300, 3
    centres = rng.uniform(0, 64, (count, 2))
    sizes = rng.uniform(4, 24, (count, 2))
    rows = np.concatenate([centres, sizes, rng.uniform(0, 1, (count, classes))], axis=1).astype(np.float32)
    pipeline = Pipeline.model_validate(
        {
            "post": {
                "kind": "boxes",
                "labels": ["cat", "dog", "fox"],
                "boxes": {
                    "format": "cxcywh",
                    "transposed": True,
                    "score_threshold": 0.6,
                    "iou_threshold": 0.4,
                    "max_detections": 40,
                },
            }
        }
    )
    found = postprocess(pipeline, {"out": rows.T[None]})["boxes"]  # (1, 4 + C, N), as YOLOv8 exports
    expected = _brute_force_nms(rows.astype(np.float64), 0.6, 0.4, 40)
    assert len(found) == len(expected) == 40
    for got, (klass, score, box) in zip(found, expected, strict=True):
        assert got["index"] == klass and got["label"] == ["cat", "dog", "fox"][klass]
        assert got["score"] == pytest.approx(score) and got["box"] == pytest.approx(box, abs=1e-4)
    assert compare_results("boxes", {"boxes": found}, {"boxes": found}) == pytest.approx(1.0)
    shifted = [dict(b, box=[b["box"][0] + 2, b["box"][1], b["box"][2] + 2, b["box"][3]]) for b in found]
    assert 0.5 < compare_results("boxes", {"boxes": found}, {"boxes": shifted}) < 0.95


def test_objectness_multiplies_the_class_scores_and_xyxy_boxes_stay_as_they_are() -> None:
    rows = np.array([[[0, 0, 10, 10, 0.5, 0.9, 0.1], [1, 1, 11, 11, 0.9, 0.2, 0.7], [0, 0, 4, 4, 0.1, 0.9, 0.9]]])
    pipeline = Pipeline.model_validate(
        {"post": {"kind": "boxes", "boxes": {"objectness": True, "score_threshold": 0.3}}}
    )
    found = postprocess(pipeline, {"out": rows})["boxes"]
    assert [(b["index"], round(b["score"], 3), b["box"]) for b in found] == [
        (1, 0.63, [1, 1, 11, 11]),  # 0.9 × 0.7; overlaps the next, but another class
        (0, 0.45, [0, 0, 10, 10]),
    ]


def test_greedy_ctc_collapses_repeats_and_drops_blanks() -> None:
    vocabulary = ["<blank>", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 3, 0, 0, 2, 0, 2]  # a a _ a b b ␣ _ _ b _ b
    logits = np.full((1, len(steps), 4), -5.0, np.float32)
    logits[0, np.arange(len(steps)), steps] = 5.0
    pipeline = Pipeline.model_validate({"post": {"kind": "ctc", "vocabulary": vocabulary}})
    result = postprocess(pipeline, {"logits": logits})
    assert result == {"text": "aab bb"}
    assert compare_results("ctc", result, {"text": "aab bb"}) == 1.0
    assert compare_results("ctc", result, {"text": "ab bb"}) == 0.0
    with pytest.raises(PipelineInputError, match="5 classes per step; the vocabulary has 4"):
        postprocess(pipeline, {"logits": np.zeros((1, 3, 5), np.float32)})
    with pytest.raises(SchemaError, match="needs its vocabulary"):
        Pipeline.parse_obj_clear({"post": {"kind": "ctc"}}, source="pipeline.yaml")


def test_embedding_mean_pools_over_the_attention_mask_and_normalises() -> None:
    rng = np.random.default_rng(5)
    hidden = rng.normal(size=(1, 6, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 0, 0]], np.int64)  # two padding tokens, which must not count
    pipeline = Pipeline.model_validate({"post": {"kind": "embedding", "pool": "mean"}})
    vector = np.array(postprocess(pipeline, {"h": hidden}, {"attention_mask": mask})["embedding"])
    expected = hidden[0, :4].mean(axis=0)
    np.testing.assert_allclose(vector, expected / np.linalg.norm(expected), rtol=1e-5)
    cls = Pipeline.model_validate({"post": {"kind": "embedding", "pool": "cls", "normalize": False}})
    np.testing.assert_allclose(postprocess(cls, {"h": hidden})["embedding"], hidden[0, 0], rtol=1e-6)
    assert compare_results("embedding", {"embedding": vector}, {"embedding": -vector}) == pytest.approx(-1.0)
    with pytest.raises(UsageError, match="no task-level comparison for kind 'tensor'"):
        compare_results("tensor", {}, {})


def test_packaging_reads_a_vocabulary_file_keeping_a_space_token(tmp_path) -> None:
    from edgesdk.schemas.pipeline import load_pipeline

    (tmp_path / "pipeline.yaml").write_text("post: {kind: ctc, blank: 0}\n")
    (tmp_path / "vocab.txt").write_text("<blank>\na\n \nb\n\n")
    pipeline = load_pipeline(tmp_path / "pipeline.yaml", vocabulary=tmp_path / "vocab.txt")
    assert pipeline.post.vocabulary == ["<blank>", "a", " ", "b"]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(UsageError, match=r"--vocabulary .*empty.txt: nothing in it"):
        load_pipeline(tmp_path / "pipeline.yaml", vocabulary=tmp_path / "empty.txt")
    with pytest.raises(SchemaError, match="needs its vocabulary"):
        load_pipeline(tmp_path / "pipeline.yaml")


def test_a_one_channel_mask_is_the_class_where_its_probability_reaches_the_threshold() -> None:
    probabilities = np.array([[0.1, 0.5], [0.7, 0.29]], np.float32)
    nchw = Pipeline.model_validate({"post": {"kind": "mask"}})
    np.testing.assert_array_equal(postprocess(nchw, {"map": probabilities[None, None]})["mask"], [[0, 1], [1, 0]])
    nhwc = Pipeline.model_validate({"post": {"kind": "mask", "mask_layout": "NHWC", "threshold": 0.3}})
    np.testing.assert_array_equal(postprocess(nhwc, {"map": probabilities[None, :, :, None]})["mask"], [[0, 1], [1, 0]])
    nhwc = Pipeline.model_validate({"post": {"kind": "mask", "mask_layout": "NHWC", "threshold": 0.05}})
    np.testing.assert_array_equal(postprocess(nhwc, {"map": probabilities[None, :, :, None]})["mask"], [[1, 1], [1, 1]])


def test_suppression_is_bounded_by_its_candidate_cap_and_the_detection_cap(monkeypatch) -> None:
    """Non-overlapping candidates beyond the cap: suppression looks at the best MAX_CANDIDATES
    only (10^5 candidates held a core for over a minute at max_detections 10,000), and a
    pipeline asking for more than 1,000 detections is refused when it is read."""
    import pydantic

    from edgesdk.pipeline import boxes as boxes_module
    from edgesdk.schemas.pipeline import BoxDecode

    assert boxes_module.MAX_CANDIDATES == 10_000
    monkeypatch.setattr(boxes_module, "MAX_CANDIDATES", 50)  # the same code path, cheaply
    count = 500
    corners = np.stack([np.arange(count) * 10.0, np.zeros(count)], axis=1)
    boxes = np.concatenate([corners, corners + 5.0], axis=1)  # none overlaps another
    scores = np.linspace(0.3, 1.0, count)
    kept = boxes_module.nms(boxes, scores, np.zeros(count, np.int64), 0.45, count)
    assert kept == list(range(count - 1, count - 51, -1))  # the 50 best, best first
    with pytest.raises(pydantic.ValidationError, match="less than or equal to 1000"):
        BoxDecode(max_detections=1_001)
