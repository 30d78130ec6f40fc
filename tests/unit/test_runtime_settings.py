"""The agent's runtime settings (runtime_threads, runtime_spinning) reach onnxruntime's session,
and only onnxruntime's: other runtimes would read them as options of their own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from edgesdk.agent.daemon import Agent
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.agent_config import AgentConfig
from tests.unit.test_agent_serving import FakeModel, variant


def _tiny_onnx() -> bytes:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@pytest.mark.parametrize(("spinning", "entry"), [("0", "0"), ("1", "1")])
def test_onnxruntime_session_gets_the_spinning_and_thread_settings(spinning: str, entry: str) -> None:
    pytest.importorskip("onnxruntime")
    from edgesdk.runtimes import load_model

    loaded = load_model("onnxruntime", _tiny_onnx(), options={"allow_spinning": spinning, "intra_op_num_threads": "1"})
    options = loaded._session.get_session_options()  # type: ignore[attr-defined]
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
    assert options.intra_op_num_threads == 1


def test_spinning_is_off_by_default_and_threads_follow_the_config() -> None:
    def options(**settings: object) -> dict[str, str]:
        config = AgentConfig(device_id="d", profile="rpi5-8gb", **settings)  # type: ignore[arg-type]
        return Agent._runtime_options(SimpleNamespace(config=config))  # type: ignore[arg-type]

    assert options() == {"allow_spinning": "0", "intra_op_num_threads": "auto"}
    assert options(runtime_spinning=True, runtime_threads=2) == {"allow_spinning": "1", "intra_op_num_threads": "2"}


def test_only_onnxruntime_variants_get_the_runtime_settings(monkeypatch) -> None:
    import edgesdk.runtimes as runtimes

    seen: dict[str, object] = {}

    def fake_load_variant(runtime, files, options=None, execution=None):  # type: ignore[no-untyped-def]
        seen[str(getattr(runtime, "value", runtime))] = options
        return FakeModel(1.0)

    monkeypatch.setattr(runtimes, "load_variant", fake_load_variant)
    manifest = SimpleNamespace(
        model=SimpleNamespace(name="m", version="1.0.0", release=1),
        variants=[variant("fp32", "fp32"), variant("int8", "int8", runtime="openvino", fmt="openvino")],
    )
    server = ModelServer(runtime_options={"allow_spinning": "0", "intra_op_num_threads": "1"})
    server.swap(SimpleNamespace(manifest=manifest, sha256="b" * 64), "key", decrypt=lambda b, vid, key: {"m": b"x"})
    assert seen == {"onnxruntime": {"allow_spinning": "0", "intra_op_num_threads": "1"}, "openvino": None}
