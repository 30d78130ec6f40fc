"""A real sentence-embedding transformer (all-MiniLM-L6-v2, three int64 inputs, dynamic batch and
sequence) through the converters, judged on its tail of sentences (issue 38, defect 9): the
dynamic per-channel int8's mean cosine clears 0.99 while its 5th percentile of sentences does not,
so it ships only under a gate its tail holds (0.985 here), and the report shows both figures.

One conversion, ONNX only and one int8 recipe, to stay cheap in CI; bench_convert.py runs every
recipe in both runtimes (BENCHMARKS.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_data(request):
    pytest.importorskip("transformers", reason="MiniLM loads with transformers (pip install 'edgesdk[convert-tflite]')")
    pytest.importorskip("tokenizers")
    from edgesdk.errors import ModelError
    from edgesdk.workloads.text_encoder import model_dir, prepare_text

    try:
        model_dir()
    except ModelError as exc:
        pytest.skip(str(exc))

    return prepare_text(Path(request.config.cache.mkdir("edgesdk-minilm-v1")), calibration=64, validation=320)


def test_minilm_int8_is_judged_on_its_tail_of_sentences_with_the_mean_beside(minilm_data, tmp_path) -> None:
    from edgesdk.converters import convert

    from edgesdk.workloads.text_encoder import INPUT_NAMES, minilm_encoder

    report = convert(
        minilm_encoder(), "rpi5-8gb", tmp_path / "out", calibration=minilm_data.calibration,
        validation=minilm_data.validation, formats=["onnx"], precisions=["fp32", "int8"],
        int8_methods=["dynamic-int8-per-channel"], output_names=["embedding"], name="minilm",
        dynamic_axes={n: {1: "sequence"} for n in INPUT_NAMES}, gate=0.985,
    )  # fmt: skip
    assert report.family == "transformer"
    shipped = {v.id: v for v in report.variants}
    int8 = shipped["onnx-int8"]
    assert int8.quantization_method == "dynamic-int8-per-channel"
    assert int8.accuracy.samples == minilm_data.validation_sentences
    assert int8.accuracy.verdict == "pass" and int8.accuracy.lower_bound >= 0.985
    (sentences,) = int8.output_accuracy
    assert sentences.statistic == "5th percentile" and sentences.samples == minilm_data.validation_sentences
    # The mean reads above 0.99 (the old gate shipped it at 0.99); 5 % of sentences are below it.
    assert sentences.value < 0.99 <= sentences.mean, sentences
    assert int8.size < 0.3 * shipped["onnx-fp32"].size
    assert [s.name for s in int8.inputs] == list(INPUT_NAMES)
    assert all(s.dtype == "int64" and s.shape == ["batch", "sequence"] for s in int8.inputs)
    assert int8.ladder_role in ("speed", "size-only")  # measured, either way labelled as host timings
    assert "host timings" in int8.latency_basis
