"""The planner: formats × precision ladder from real device profiles, with a reason for everything."""

from __future__ import annotations

import pytest
from edgesdk.converters import planner
from edgesdk.converters.planner import make_plan
from edgesdk.converters.recipes import RECIPES, Family
from edgesdk.converters.registry import CONVERTERS

from edgesdk.profiles import get_profile
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName

ALL_HOST_RUNTIMES = [RuntimeName.ONNXRUNTIME, RuntimeName.LITERT, RuntimeName.OPENVINO]


@pytest.fixture(autouse=True)
def everything_installed(monkeypatch):
    # The plan must not depend on what this test machine happens to have installed.
    monkeypatch.setattr(planner, "missing_packages", lambda name, source_kind="pytorch": [])
    monkeypatch.setattr(planner, "missing_method_packages", lambda name, method: [])


def ids(plan) -> list[str]:
    return [v.id for v in plan.variants]


def test_rpi5_pytorch_gets_every_runtime_and_full_ladder() -> None:
    plan = make_plan(
        get_profile("rpi5-8gb"), "pytorch", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES, family=Family.CONVNET
    )
    assert ids(plan) == [
        "tflite-fp32", "tflite-fp16", "tflite-int8",
        "onnx-fp32", "onnx-fp16", "onnx-int8",
        "openvino-fp32", "openvino-fp16", "openvino-int8",
    ]  # fmt: skip
    assert plan.rejected == []
    onnx_int8 = next(v for v in plan.variants if v.id == "onnx-int8")
    assert onnx_int8.methods == (
        "static-qdq-per-channel", "static-qdq-percentile", "static-qdq-u8", "static-qdq-percentile-u8",
        "nncf-qdq", "cle-static-qdq",
    )  # fmt: skip
    openvino_int8 = next(v for v in plan.variants if v.id == "openvino-int8")
    assert openvino_int8.methods == ("nncf-ptq", "nncf-ptq-bias-correction", "nncf-ptq-accuracy-control")
    assert any("keep the faster one" in d for d in plan.decisions)
    ov_fp32 = next(v for v in plan.variants if v.id == "openvino-fp32")
    assert ov_fp32.options["INFERENCE_PRECISION_HINT"] == "f32"


def test_onnx_input_cannot_reach_tflite_and_says_why(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EDGESDK_ONNX2TF", str(tmp_path / "no-onnx2tf"))  # the heavy route's toolchain is absent
    monkeypatch.setenv("EDGESDK_ONNX2TORCH", "0")  # and the light route is off
    plan = make_plan(get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert not any(v.format == ModelFormat.TFLITE for v in plan.variants)
    reasons = [r.reason for r in plan.rejected if r.format == ModelFormat.TFLITE]
    assert len(reasons) == 3 and all("onnx2tf" in r and "onnx2torch" in r and "PyTorch" in r for r in reasons)


def test_a_tflite_source_plans_only_reachable_formats_and_says_once_why_not_onnx() -> None:
    plan = make_plan(get_profile("rpi5-8gb"), "tflite", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert {v.format for v in plan.variants} == {ModelFormat.TFLITE, ModelFormat.OPENVINO}
    assert plan.rejected == []
    why = [d for d in plan.decisions if "not offered for a tflite source" in d]
    assert len(why) == 1 and why[0].startswith("onnx") and "openvino, tflite" in why[0]
    asked = make_plan(
        get_profile("rpi5-8gb"), "tflite", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES,
        formats={ModelFormat.ONNX},
    )  # fmt: skip
    assert {r.format for r in asked.rejected} == {ModelFormat.ONNX}
    assert all("onnx takes pytorch, onnx models" in r.reason for r in asked.rejected)


def test_onnx_input_reaches_tflite_through_onnx2torch_without_onnx2tf(monkeypatch, tmp_path) -> None:
    from edgesdk.converters.onnx2torch_route import missing_reason

    if missing_reason():  # importorskip would import it, and it imports torchvision
        pytest.skip(missing_reason())
    monkeypatch.setenv("EDGESDK_ONNX2TF", str(tmp_path / "no-onnx2tf"))
    plan = make_plan(get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert {v.precision for v in plan.variants if v.format == ModelFormat.TFLITE} == set(planner.LADDER)


def test_without_calibration_only_data_free_int8_or_a_reason() -> None:
    plan = make_plan(
        get_profile("intel-nuc-core-ultra"), "pytorch", has_calibration=False, host_runtimes=ALL_HOST_RUNTIMES
    )
    assert next(v for v in plan.variants if v.id == "onnx-int8").methods == ("dynamic-int8",)
    assert next(v for v in plan.variants if v.id == "openvino-int8").methods == ("nncf-weights-int8",)
    convnet = make_plan(
        get_profile("intel-nuc-core-ultra"), "pytorch", has_calibration=False, host_runtimes=ALL_HOST_RUNTIMES,
        family=Family.CONVNET,
    )  # fmt: skip
    rejected = {(r.format, r.precision): r.reason for r in convnet.rejected}
    assert "calibration" in rejected[(ModelFormat.OPENVINO, Precision.INT8)]
    assert "calibration" in rejected[(ModelFormat.ONNX, Precision.INT8)]


def test_a_transformer_gets_the_transformer_recipes() -> None:
    plan = make_plan(
        get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES,
        family=Family.TRANSFORMER,
    )  # fmt: skip
    methods = {v.id: v.methods for v in plan.variants if v.precision == Precision.INT8}
    assert methods["onnx-int8"] == (
        "dynamic-int8-per-channel", "weight-only-int8", "static-qdq-weight-matmuls", "dynamic-int8",
    )  # fmt: skip
    assert methods["openvino-int8"] == ("nncf-ptq-transformer", "nncf-weights-int8")
    without = make_plan(
        get_profile("rpi5-8gb"), "onnx", has_calibration=False, host_runtimes=ALL_HOST_RUNTIMES,
        family=Family.TRANSFORMER,
    )  # fmt: skip
    methods = {v.id: v.methods for v in without.variants if v.precision == Precision.INT8}
    assert methods["onnx-int8"] == ("dynamic-int8-per-channel", "weight-only-int8", "dynamic-int8")
    assert methods["openvino-int8"] == ("nncf-weights-int8",)


@pytest.mark.parametrize("converter", sorted(RECIPES))
def test_every_recipe_is_a_declared_method_of_its_converter(converter: str) -> None:
    declared = CONVERTERS[converter].capabilities.int8_methods
    for family, methods in RECIPES[converter].items():
        assert methods, f"{converter} has no recipe for {family}"
        assert set(methods) <= set(declared), f"{converter} {family}: {set(methods) - set(declared)} not declared"


def test_accelerators_are_named_in_the_reasoning() -> None:
    plan = make_plan(
        get_profile("jetson-orin-nano-8gb"), "pytorch", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES
    )
    line = next(d for d in plan.decisions if d.startswith("onnx int8 planned"))
    assert "Ampere GPU" in line


def test_coreml_is_unvalidated_on_a_host_that_cannot_predict() -> None:
    plan = make_plan(get_profile("iphone-15-pro"), "pytorch", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert ids(plan) == ["coreml-fp16", "coreml-int8"]  # the profile lists no fp32 for iPhone
    assert all(not v.numeric_validation for v in plan.variants)
    assert next(v for v in plan.variants if v.id == "coreml-int8").methods == ("linear-weights-int8",)
    assert any("unvalidated" in d and "--allow-unvalidated" in d for d in plan.decisions)


def test_filters_and_formats_the_device_does_not_run() -> None:
    plan = make_plan(
        get_profile("rpi5-8gb"),
        "pytorch",
        has_calibration=True,
        host_runtimes=ALL_HOST_RUNTIMES,
        formats={ModelFormat.ONNX, ModelFormat.COREML},
        precisions={Precision.FP32, Precision.INT8},
    )
    assert ids(plan) == ["onnx-fp32", "onnx-int8"]
    coreml = [r for r in plan.rejected if r.format == ModelFormat.COREML]
    assert coreml and "does not run coreml" in coreml[0].reason
    assert any("not in --precisions" in d for d in plan.decisions)


def test_missing_converter_packages_and_host_runtime_are_reasons(monkeypatch) -> None:
    monkeypatch.setattr(
        planner, "missing_packages", lambda name, source_kind="pytorch": ["openvino"] if name == "openvino" else []
    )
    plan = make_plan(get_profile("rpi5-8gb"), "pytorch", has_calibration=True, host_runtimes=[RuntimeName.ONNXRUNTIME])
    assert ids(plan) == ["onnx-fp32", "onnx-fp16", "onnx-int8"]
    reasons = {r.format: r.reason for r in plan.rejected}
    assert "edgesdk[convert-openvino]" in reasons[ModelFormat.OPENVINO]
    assert "litert is not installed on this host" in reasons[ModelFormat.TFLITE]


def test_an_int8_method_whose_package_is_missing_is_skipped_with_a_reason(monkeypatch) -> None:
    monkeypatch.setattr(
        planner, "missing_method_packages", lambda name, method: ["nncf"] if method == "nncf-qdq" else []
    )
    plan = make_plan(get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert next(v for v in plan.variants if v.id == "onnx-int8").methods == ("static-qdq-per-channel", "dynamic-int8")
    assert "onnx int8: nncf-qdq skipped, it needs nncf" in plan.decisions


def test_int8_methods_can_be_restricted() -> None:
    plan = make_plan(
        get_profile("rpi5-8gb"), "pytorch", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES,
        int8_methods={"dynamic-int8"},
    )  # fmt: skip
    methods = {v.id: v.methods for v in plan.variants if v.precision == Precision.INT8}
    assert methods == {"tflite-int8": ("dynamic-int8",), "onnx-int8": ("dynamic-int8",)}
    (openvino,) = [r for r in plan.rejected if r.format == ModelFormat.OPENVINO]
    assert "nncf-ptq" in openvino.reason
