"""The foundation's real-model check: the digits CNN trains, exports to ONNX, and runs from
memory in the agent's onnxruntime backend with the same predictions as PyTorch."""

from __future__ import annotations

import numpy as np
import pytest


def test_digits_cnn_is_a_real_classifier(digits) -> None:
    assert digits.test_accuracy >= 0.97


def test_onnx_from_memory_matches_torch(digits) -> None:
    torch = pytest.importorskip("torch")
    from edgesdk.runtimes import load_model

    data = np.load(digits.validation)
    with torch.no_grad():
        reference = digits.load_model()(torch.from_numpy(data["image"])).numpy()
    model = load_model("onnxruntime", digits.onnx.read_bytes())
    assert [s.name for s in model.inputs] == ["image"]
    assert model.inputs[0].shape[0] == "batch"
    out = model.run({"image": data["image"]})["logits"]
    assert np.abs(out - reference).max() < 1e-4
    assert (out.argmax(1) == reference.argmax(1)).mean() == 1.0
