"""docs/field-corpus.md as field_corpus_table renders it: a row per shipped variant with each
output's figure against its gate, the one-line reason where nothing shipped, and a command block
the docs tests skip with its measured time."""

from __future__ import annotations

from edgesdk.workloads.field_corpus_table import render

STAMP = {"command": "scripts/field-corpus", "machine": "test host", "date": "2026-12-05 20:00 UTC",
         "minutes": 21.4, "models": ["iris_landmark"], "profiles": ["rpi5-8gb", "coral-dev-board"],
         "revision": "abc1234"}  # fmt: skip
FIGURE = {"output": "output_iris", "metric": "abs", "value": 0.52, "statistic": "worst sample", "mean": 0.3,
          "threshold": 1.0, "passed": True}  # fmt: skip
SHIPPED = {"model": "iris_landmark", "profile": "rpi5-8gb", "seconds": 60.0, "revision": "abc1234", "reason": "",
           "rejected": ["fp16 failed: not fp16"],
           "shipped": [{"id": "openvino-fp16", "quantization_method": "fp16-weight-compression", "size": 1_630_000,
                        "latency_vs_fp32": 0.5, "outputs": [FIGURE]}]}  # fmt: skip
REFUSED = {"model": "iris_landmark", "profile": "coral-dev-board", "seconds": 5.0, "revision": "abc1234",
           "shipped": [], "reason": "no variant can ship: a|b"}  # fmt: skip


def test_the_field_corpus_table_shows_each_outputs_figure_and_why_nothing_shipped() -> None:
    doc = render([SHIPPED, REFUSED], STAMP)
    assert "# not run by the docs tests: takes 21 minutes on the machine below\nscripts/field-corpus\n" in doc
    assert (
        "| iris_landmark | rpi5-8gb | openvino-fp16 (fp16-weight-compression) | `output_iris` abs 0.52 ≤ 1 | 0.50 "
        "| 1.63 MB |" in doc
    )
    assert "| iris_landmark | coral-dev-board | **nothing shipped** | no variant can ship: a\\|b | — | — |" in doc
    assert "  - fp16 failed: not fp16" in doc  # the dropped variants' reasons
