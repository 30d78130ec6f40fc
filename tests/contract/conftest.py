"""Sources shared by the converter and runtime contract suites: the digits CNN, as PyTorch and as ONNX."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def digits_sources(digits, tmp_path_factory):
    """(pytorch SourceModel, onnx SourceModel, calibration, validation inputs, reference logits)."""
    from edgesdk.converters.source import load_source, reference_outputs

    calibration = dict(np.load(digits.calibration))
    validation = dict(np.load(digits.validation))
    validation.pop("labels")
    torch_source = load_source(
        digits.load_model(),
        tmp_path_factory.mktemp("torch-src"),
        example=calibration,
        name="digits",
        output_names=["logits"],
    )
    onnx_source = load_source(digits.onnx, tmp_path_factory.mktemp("onnx-src"))
    reference = reference_outputs(torch_source, validation)
    return torch_source, onnx_source, calibration, validation, reference
