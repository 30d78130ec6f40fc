"""A metric per output kind and per output, and gates that read the tail (issue 38, defects 7 and 9)."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.output_metrics import (
    OutputMetric,
    choose,
    greedy_ctc,
    mask_iou,
    parse_metric,
    per_sample,
    read_output,
    requested_metrics,
    resolve,
)
from edgesdk.converters.statistics import bootstrap_mean_lower, order_statistic_rank, tail_reading
from edgesdk.converters.validate import judge_outputs, summary

from edgesdk.errors import UsageError


def test_a_worst_sentence_under_the_gate_fails_although_the_bound_of_the_mean_holds() -> None:
    # Defect 9: a sentence encoder's int8, 16 sentences, one at cosine 0.9887 under the 0.99 gate.
    cosines = np.array([0.9995] * 15 + [0.9887])
    assert bootstrap_mean_lower(cosines) >= 0.99  # the old gate read this and passed
    reading = read_output(OutputMetric("cosine", 0.99), cosines)
    assert reading.verdict == "fail" and reading.statistic == "worst sample"
    assert reading.value == pytest.approx(0.9887)
    assert reading.mean == pytest.approx(cosines.mean())  # the mean is shown beside the tail


def test_from_twenty_samples_the_tail_is_the_5th_percentile_with_an_order_statistic_bound() -> None:
    assert order_statistic_rank(58) == 0 and order_statistic_rank(59) == 1 and order_statistic_rank(100) == 2
    one_bad = np.array([0.999] * 99 + [0.95])
    reading = tail_reading(one_bad, 0.99)
    assert reading.statistic == "5th percentile" and reading.verdict == "pass"  # one sentence in 100 is the tail's
    assert reading.lower_bound == pytest.approx(0.999)  # the 2nd smallest of 100 bounds the 5th percentile
    ten_bad = np.array([0.999] * 90 + [0.98] * 10)
    assert tail_reading(ten_bad, 0.99).verdict == "fail"
    assert bootstrap_mean_lower(ten_bad) >= 0.99  # the mean would have passed it
    few_for_a_bound = np.array([0.999] * 39 + [0.95])
    assert tail_reading(few_for_a_bound, 0.99).verdict == "inconclusive"  # the worst sample stands in as its bound


def test_an_error_gates_on_its_high_tail_in_the_outputs_units() -> None:
    errors = np.array([0.2] * 30 + [3.0] * 5)
    reading = tail_reading(errors, 1.5, lower_is_better=True)
    assert reading.statistic.startswith("95th percentile") and reading.verdict == "fail"
    assert reading.value == pytest.approx(3.0) and reading.mean == pytest.approx(errors.mean())


def test_landmarks_47_units_off_fail_abs_while_their_cosine_passes() -> None:
    # Defect 7: 468 face landmarks (x, y, z) on a 64 px input; int8 moves one by 47 px.
    rng = np.random.default_rng(0)
    want = rng.uniform(0, 64, (4, 468, 3))
    out = want.copy()
    out[1, 7, 0] += 47.0
    assert per_sample(OutputMetric("cosine"), out, want).min() > 0.99
    errors = per_sample(OutputMetric("abs", 1.5), out, want)
    assert errors.tolist() == pytest.approx([0.0, 47.0, 0.0, 0.0])
    assert read_output(OutputMetric("abs", 1.5), errors).verdict == "fail"


def test_greedy_ctc_merges_repeats_and_drops_the_blank() -> None:
    steps = np.eye(4)[[0, 2, 2, 0, 3, 3, 2]]  # blank 0: "2 3 2"
    assert greedy_ctc(steps) == (2, 3, 2)
    assert greedy_ctc(steps, blank=3) == (0, 2, 0, 2)


def test_decoded_text_differs_where_a_high_cosine_hides_it() -> None:
    # A recognizer's step where two classes are close: a small change flips the decoded character.
    want = np.full((8, 25, 4), 0.01)
    want[:, :, 1] = 0.9
    want[:, 2, 2] = 0.89
    out = want.copy()
    out[0, 2, 2] = 0.91  # sample 0, step 2 now reads class 2: "1 2 1", not "1"
    assert per_sample(OutputMetric("cosine"), out, want).min() > 0.99
    equal = per_sample(OutputMetric("ctc", 0.99), out, want)
    assert equal.tolist() == [0.0] + [1.0] * 7
    assert read_output(OutputMetric("ctc", 0.99), equal).verdict == "fail"
    hook = OutputMetric("ctc", 0.99, decode=lambda logits: "x")  # a user's decoder that ignores the logits
    assert per_sample(hook, out, want).tolist() == [1.0] * 8


def test_mask_iou_thresholds_one_channel_and_argmaxes_several() -> None:
    want = np.zeros((2, 1, 4, 4))
    want[:, :, :2, :] = 0.9
    out = want.copy()
    out[1, :, 0, :] = 0.1  # sample 1 loses half its mask
    assert mask_iou(out, want).tolist() == pytest.approx([1.0, 0.5])
    classes = np.zeros((1, 3, 4, 4))
    classes[0, 0] = 1.0  # every pixel class 0
    moved = classes.copy()
    moved[0, 2, 0, 0] = 2.0  # one pixel to class 2: class 0 IoU 15/16, class 2 IoU 0
    assert mask_iou(moved, classes).tolist() == pytest.approx([15 / 32])


def test_each_output_gets_a_metric_from_its_name_shape_and_values() -> None:
    softmax_steps = np.full((2, 6, 5), 0.2)
    cases = {
        "logits": (np.zeros((2, 10)), "top1"),
        "embedding": (np.zeros((2, 384)), "cosine"),
        "landmarks": (np.zeros((2, 63)), "abs"),
        "prob": (np.zeros((2, 1)), "abs"),
        "softmax_5.tmp_0": (softmax_steps, "ctc"),
        "segmentation_mask": (np.zeros((2, 256, 256, 1)), "iou"),
        "output_0": (np.full((2, 1, 8, 8), 0.3), "iou"),
        "features_map": (np.zeros((2, 16, 8, 8)), "cosine"),
    }
    for name, (reference, kind) in cases.items():
        chosen = choose(name, reference)
        assert chosen.kind == kind, name
        assert chosen.why, name  # the report says why
    # MediaPipe's hand landmarks: Identity [1, 63] beside three other outputs is not a classifier.
    coordinates = np.random.default_rng(0).uniform(0, 224, (2, 63))
    assert choose("Identity", coordinates, alone=False).kind == "abs"
    assert choose("Identity", coordinates, alone=True).kind == "top1"  # a model's only [N, n] output: scores
    assert choose("Identity", np.full((2, 5), 0.2), alone=False).kind == "top1"  # a softmax is class scores


def test_metric_syntax_per_output_and_its_errors() -> None:
    assert parse_metric("landmarks=abs:1.5") == ("landmarks", OutputMetric("abs", 1.5))
    assert parse_metric("text=ctc:0.95:blank=36") == ("text", OutputMetric("ctc", 0.95, blank=36))
    assert parse_metric("cosine") == (None, OutputMetric("cosine"))
    assert parse_metric("ctc:blank=3") == (None, OutputMetric("ctc", blank=3))
    for bad, named in [
        ("x=l2", "'l2'"),
        ("x=abs:wide", "'wide'"),
        ("=abs", "no output name"),
        ("x=top1:blank=2", "blank"),
    ]:
        with pytest.raises(UsageError, match=named):
            parse_metric(bad)
    asked = requested_metrics({"landmarks": "abs:1.5", "text": OutputMetric("ctc", blank=3)})
    assert asked == {"landmarks": OutputMetric("abs", 1.5), "text": OutputMetric("ctc", blank=3)}
    assert requested_metrics("auto") == {} and requested_metrics(["a=iou", "top1"])[None].kind == "top1"


def test_metric_names_an_output_holding_a_colon_as_tf2onnx_names_them() -> None:
    assert parse_metric("StatefulPartitionedCall:0=cosine") == ("StatefulPartitionedCall:0", OutputMetric("cosine"))
    assert parse_metric("out:1=ctc:0.9:blank=3") == ("out:1", OutputMetric("ctc", 0.9, blank=3))
    assert parse_metric("abs:0=iou:0.5") == ("abs:0", OutputMetric("iou", 0.5))
    assert requested_metrics(["Identity:0=abs:2", "top1"])["Identity:0"] == OutputMetric("abs", 2.0)
    with pytest.raises(UsageError, match="'l2'"):
        parse_metric("Identity:0=l2")


def test_resolve_fills_thresholds_and_refuses_an_unknown_output() -> None:
    reference = {"logits": np.zeros((3, 10)), "landmarks": np.linspace(0, 64, 3 * 42).reshape(3, 42)}
    chosen = resolve(reference, {}, gate=0.95)
    assert chosen["logits"].threshold == 0.95  # --gate: the minimum of every kind but abs
    assert chosen["landmarks"].threshold == pytest.approx(0.64)  # 1 % of the output's range, in its units
    assert "1% of the output's range" in chosen["landmarks"].why
    assert resolve(reference, {"landmarks": OutputMetric("abs", 2.0)})["landmarks"].why == "named with --metric"
    with pytest.raises(UsageError, match=r"\['boxes'\].*its outputs: \['landmarks', 'logits'\]"):
        resolve(reference, {"boxes": OutputMetric("abs", 1.0)})


def test_every_output_is_checked_and_the_variant_passes_only_when_all_do() -> None:
    rng = np.random.default_rng(1)
    reference = {"logits": rng.standard_normal((24, 10)), "landmarks": rng.uniform(0, 64, (24, 42))}
    outputs = {"logits": reference["logits"].copy(), "landmarks": reference["landmarks"] + 2.0}
    metrics = {"logits": OutputMetric("top1", 0.9), "landmarks": OutputMetric("abs", 1.5)}
    judged = judge_outputs(outputs, reference, metrics)
    assert [(o.output, o.metric, o.passed) for o, _ in judged] == [
        ("logits", "top1", True),
        ("landmarks", "abs", False),
    ]
    result = summary("top1", 0.9, outputs, reference, judged, {})
    assert not result.passed and result.verdict == "fail"
    assert "landmarks: abs 2 (95th percentile" in result.note and "mean 2" in result.note


def test_an_inconclusive_agreement_says_how_many_samples_would_tell() -> None:
    from edgesdk.quality.output_metrics import sentence

    metric = OutputMetric(kind="top1", threshold=0.75)
    reading = read_output(metric, np.array([1.0] * 9 + [0.0] * 1))  # 90 % agree on 10: bound under 0.75
    text = sentence("logits", metric, reading)
    assert reading.verdict == "inconclusive", text
    assert "samples would tell" in text, text
