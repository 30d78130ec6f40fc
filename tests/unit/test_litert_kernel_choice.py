"""Which kernels LiteRT runs a model on (edgesdk/runtimes/litert_backend.py, issue 38).

With XNNPACK, a quantized model resized to another batch after it has run gave one of two
answers for the same bytes and inputs (basic-pitch's int8: contour cosine 0.989508 or 0.933721);
the builtin kernels gave one. So such a model loads without XNNPACK, in validation and on the
device alike (both load through load_model), while float models and static-shape int8 keep it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.prebuilt_models import BASIC_PITCH, WAKEWORD, extract

pytest.importorskip("ai_edge_litert", reason="needs edgesdk[litert]")


def _runs_on_xnnpack(model: bytes) -> bool:
    """Whether the loaded interpreter handed any node to a delegate (the default one is XNNPACK)."""
    from edgesdk.runtimes import load_model

    loaded = load_model("litert", model, options={"num_threads": "1"})
    try:
        return any(op["op_name"] == "DELEGATE" for op in loaded._interpreter._get_ops_details())
    finally:
        loaded.close()


def _dynamic_int8(source: Path) -> bytes:
    pytest.importorskip("ai_edge_quantizer", reason="needs edgesdk[convert-tflite]")
    from ai_edge_quantizer import quantizer, recipe
    from edgesdk.converters.quiet import quiet_native

    with quiet_native():
        q = quantizer.Quantizer(source.read_bytes())
        q.load_quantization_recipe(recipe.dynamic_wi8_afp32())
        return bytes(q.quantize().quantized_model)


def test_a_quantized_tflite_with_a_resizable_batch_runs_on_builtin_kernels_not_xnnpack(tmp_path) -> None:
    source = extract(BASIC_PITCH, "nmp.tflite", tmp_path)  # input [-1, 43844, 1]
    assert not _runs_on_xnnpack(_dynamic_int8(source))
    # Only those: the float model and a static-shape int8 (never resized) keep XNNPACK.
    assert _runs_on_xnnpack(source.read_bytes())
    assert _runs_on_xnnpack(extract(WAKEWORD, "okay_nabu.tflite", tmp_path).read_bytes())  # int8, [1, 3, 40]
