"""Every variant of a bundle is listed with why it is loaded or not (the agent's runtime choice)."""

from __future__ import annotations

from types import SimpleNamespace

from edgesdk.agent.serving import ModelServer

from edgesdk.errors import BackendUnavailableError
from edgesdk.profiles import get_profile
from tests.unit.test_agent_serving import FakeModel, variant


def test_each_variant_is_loaded_or_says_why_not(monkeypatch) -> None:
    import edgesdk.runtimes as runtimes

    def fake_load_variant(runtime, files, options=None, execution=None):
        if runtime == "litert":
            raise BackendUnavailableError("runtime 'litert' is not installed: pip install 'edgesdk[litert]'")
        return FakeModel(1.0)

    monkeypatch.setattr(runtimes, "load_variant", fake_load_variant)
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=1),
        variants=[
            variant("tflite-fp32", "fp32", runtime="litert", fmt="tflite"),
            variant("onnx-fp32", "fp32"),
            variant("openvino-fp32", "fp32", runtime="openvino", fmt="openvino"),
            variant("onnx-fp16", "fp16", passed=False),
            variant("coreml-fp32", "fp32", runtime="coreml", fmt="coreml"),
        ],
    )
    server = ModelServer(profile=get_profile("rpi5-8gb"))
    server.swap(SimpleNamespace(manifest=manifest, sha256="b" * 64), "key", decrypt=lambda b, vid, key: {})
    choices = {c["id"]: c for c in server.describe_variant_choices()}
    assert list(choices) == ["tflite-fp32", "onnx-fp32", "openvino-fp32", "onnx-fp16", "coreml-fp32"]
    assert choices["onnx-fp32"]["loaded"] and choices["onnx-fp32"]["active"]
    assert "#2 of rpi5-8gb's runtimes" in choices["onnx-fp32"]["reason"]
    assert choices["tflite-fp32"]["reason"].startswith("did not load: runtime 'litert' is not installed")
    assert choices["openvino-fp32"]["reason"] == (
        "onnx-fp32 serves fp32 (onnxruntime comes first in rpi5-8gb's runtimes); one variant per precision is loaded"
    )
    assert choices["onnx-fp16"]["reason"] == "failed its accuracy gate when it was packaged"
    assert choices["coreml-fp32"]["reason"].startswith("not for this profile: rpi5-8gb runs tflite, onnx, openvino")
    assert not any(c["loaded"] for vid, c in choices.items() if vid != "onnx-fp32")
    (described,) = server.describe_models()
    assert described["bundle_variants"] == list(choices.values())


def test_the_profiles_providers_are_asked_for_and_a_cpu_fallback_says_why(monkeypatch) -> None:
    import edgesdk.runtimes as runtimes
    from edgesdk.runtimes.execution import ExecutionRequest, choose_ort_providers, ort_report

    asked: list[ExecutionRequest | None] = []

    def fake_load_variant(runtime, files, options=None, execution=None):
        asked.append(execution)
        model = FakeModel(1.0)
        # What the real backend reports on a CPU-only onnxruntime (tests/unit/test_runtime_execution.py).
        providers, skipped = choose_ort_providers(execution, ["CPUExecutionProvider"])
        model.execution = ort_report(execution, providers, skipped)
        return model

    monkeypatch.setattr(runtimes, "load_variant", fake_load_variant)
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=1), variants=[variant("onnx-fp32", "fp32")]
    )
    server = ModelServer(profile=get_profile("jetson-orin-nano-8gb"))
    server.swap(SimpleNamespace(manifest=manifest, sha256="b" * 64), "key", decrypt=lambda b, vid, key: {})
    assert asked == [ExecutionRequest(("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"))]
    (choice,) = server.describe_variant_choices()
    assert choice["loaded"] and "running on CPUExecutionProvider, not TensorrtExecutionProvider" in choice["reason"]
    assert choice["execution"]["using"] == ["CPUExecutionProvider"]
    assert set(choice["execution"]["skipped"]) == {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
