"""One variant's failure never loses the others (issue 38): an exception of any type while one
variant is built is that variant's rejection, in one line, and the rest ship."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters import convert

from tests.onnx_builders import tiny_convnet

pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")


def test_a_converter_crashing_on_one_precision_loses_only_that_variant(tmp_path, monkeypatch) -> None:
    from edgesdk.converters.onnx_backend import OnnxConverter

    from edgesdk.schemas.common import Precision

    real = OnnxConverter.convert

    def crash_on_fp16(self, request):
        if request.precision == Precision.FP16:
            raise KeyError("w1")  # what a toolchain raised on Constant weights (issue 38): no EdgeSDKError
        return real(self, request)

    monkeypatch.setattr(OnnxConverter, "convert", crash_on_fp16)
    data = {"x": np.random.default_rng(0).standard_normal((6, 3, 8, 8)).astype(np.float32)}
    report = convert(
        tiny_convnet(tmp_path / "net.onnx"), "rpi5-8gb", tmp_path / "out", validation=data,
        formats=["onnx"], precisions=["fp32", "fp16"],
    )  # fmt: skip
    assert [v.id for v in report.variants] == ["onnx-fp32"]
    (fp16,) = [r for r in report.rejected if r.precision == Precision.FP16]
    assert fp16.reason == "failed: KeyError: 'w1'"
