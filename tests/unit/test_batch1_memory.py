"""A variant's memory measured at batch 1 in a fresh process (converters/batch1_memory.py), and
what the pipeline does when that measurement fails (issue 38, defect 4)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgesdk.errors import ConversionError
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.report import VariantMeasurements
from tests.onnx_builders import tiny_convnet

pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")


def test_a_fresh_process_measures_the_growth_of_one_load_and_batch_1_run(tmp_path: Path) -> None:
    from edgesdk.converters.batch1_memory import batch1_peak_mb

    model = tiny_convnet(tmp_path / "model.onnx")
    peak = batch1_peak_mb("onnxruntime", {"model.onnx": model}, {}, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    assert 0 < peak < 200


def test_a_variant_that_fails_to_load_in_the_fresh_process_is_one_line(tmp_path: Path) -> None:
    from edgesdk.converters.batch1_memory import batch1_peak_mb

    (tmp_path / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ConversionError) as caught:
        batch1_peak_mb("onnxruntime", {"model.onnx": tmp_path / "model.onnx"}, {}, {"x": np.zeros((1, 3), np.float32)})
    message = str(caught.value)
    assert message.startswith("onnxruntime: measuring memory at batch 1 in a fresh process failed: ")
    assert "\n" not in message


def test_a_failed_probe_keeps_the_in_process_figure_and_the_other_variants(monkeypatch) -> None:
    from edgesdk.converters import batch1_memory
    from edgesdk.converters.input_spec import InputLayout
    from edgesdk.converters.pipeline import _measure_batch1_memory
    from edgesdk.converters.planner import PlannedVariant

    def probe(runtime, files, options, feeds) -> float:
        if "broken" in files:
            raise ConversionError("onnxruntime: measuring memory at batch 1 in a fresh process failed: boom")
        return 42.0

    monkeypatch.setattr(batch1_memory, "batch1_peak_mb", probe)

    def built(name: str, precision: Precision) -> SimpleNamespace:
        planned = PlannedVariant("onnx", ModelFormat.ONNX, RuntimeName.ONNXRUNTIME, precision)
        measured = VariantMeasurements(peak_rss_mb=7.0, note="peak RSS is growth during load + one batch-1 inference")
        return SimpleNamespace(
            planned=planned,
            artifact=SimpleNamespace(files={name: Path(name)}),
            result=SimpleNamespace(measurements=measured),
        )

    fp32, int8 = built("model.onnx", Precision.FP32), built("broken", Precision.INT8)
    run = SimpleNamespace(
        decisions=[], data={"x": np.zeros((2, 3), np.float32)}, source=SimpleNamespace(layout=InputLayout())
    )
    _measure_batch1_memory(run, [fp32, int8])
    assert fp32.result.measurements.peak_rss_mb == 42.0
    assert fp32.result.measurements.note.endswith("one batch-1 inference in a fresh process")
    assert int8.result.measurements.peak_rss_mb == 7.0
    assert run.decisions == [
        "onnx-int8: onnxruntime: measuring memory at batch 1 in a fresh process failed: boom; "
        "its peak memory is the in-process figure"
    ]
