"""Small real ONNX models built with onnx.helper, for the shapes the digits CNN does not have.

- :func:`stateful_vad`: a voice-activity-detector-shaped recurrent cell like Silero VAD's
  interface: ``audio [batch, 32]``, ``state [2, batch, 8]`` (batch on axis 1), ``sr`` a 0-d
  int64 sample rate; outputs ``prob [batch, 1]`` and the next state ``stateN [2, batch, 8]``.
- :func:`gated_by_if`: its layers (MatMul, Add, Relu) sit inside the two branches of an
  ``If`` on a 0-d bool input, as a scripted PyTorch model exports them.
- :func:`tiny_convnet`: Conv → Relu (→ Conv) → GlobalAveragePool → Gemm on ``x [batch, 3, 8, 8]``,
  for the convnet int8 recipes, with :func:`convnet_source` as the converters' source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FRAME, HIDDEN = 32, 8


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "W_in": (rng.standard_normal((FRAME, HIDDEN)) * 0.3).astype(np.float32),
        "W_state": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.3).astype(np.float32),
        "W_out": (rng.standard_normal((HIDDEN, 1)) * 0.5).astype(np.float32),
    }


def stateful_vad(path: Path, seed: int = 0) -> Path:
    """h = tanh(audio·W_in + state[0]·W_state) · sr/16000; prob = σ(h·W_out); stateN = [h, state[0]]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = _weights(seed)
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array(16000.0, np.float32), "base_rate"),
    ]
    nodes = [
        helper.make_node("Gather", ["state", "zero"], ["state0"], axis=0),
        helper.make_node("MatMul", ["audio", "W_in"], ["a"], name="in_proj"),
        helper.make_node("MatMul", ["state0", "W_state"], ["s"], name="state_proj"),
        helper.make_node("Add", ["a", "s"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h0"]),
        helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["sr_f", "base_rate"], ["rate"]),
        helper.make_node("Mul", ["h0", "rate"], ["h"]),
        helper.make_node("MatMul", ["h", "W_out"], ["logit"], name="out_proj"),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
        helper.make_node("Unsqueeze", ["h", "axis0"], ["h_u"]),
        helper.make_node("Unsqueeze", ["state0", "axis0"], ["s_u"]),
        helper.make_node("Concat", ["h_u", "s_u"], ["stateN"], axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "stateful_vad",
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", FRAME]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", HIDDEN]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", HIDDEN]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def vad_stream(samples: int, steps: int = 1, seed: int = 1) -> dict[str, np.ndarray]:
    """Data in the model's own layout: audio [N, 32], state [2, N, 8], sr 0-d (steps > 1: a leading step axis)."""
    rng = np.random.default_rng(seed)
    audio = rng.standard_normal((steps, samples, FRAME)).astype(np.float32)
    state = (rng.standard_normal((2, samples, HIDDEN)) * 0.1).astype(np.float32)
    return {"audio": audio[0] if steps == 1 else audio, "state": state, "sr": np.array(16000, np.int64)}


def vad_numpy(feeds: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The same cell in numpy, to check runtimes against something that is not a runtime."""
    w = _weights(seed)
    state0 = feeds["state"][0]
    h = np.tanh(feeds["audio"] @ w["W_in"] + state0 @ w["W_state"]) * (float(feeds["sr"]) / 16000.0)
    prob = 1 / (1 + np.exp(-(h @ w["W_out"])))
    return {"prob": prob.astype(np.float32), "stateN": np.stack([h, state0]).astype(np.float32)}


def gated_by_if(path: Path, seed: int = 0, features: int = 64, hidden: int = 256, classes: int = 10) -> Path:
    """logits = If(use_relu, relu(x·W1 + b1)·W2, tanh(x·W1 + b1)·W3): every layer inside a branch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {
        "W1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32),
        "b1": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(np.float32),
        "W3": (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(np.float32),
    }

    def branch(name: str, act: str, head: str) -> onnx.GraphProto:
        nodes = [
            helper.make_node("MatMul", ["x", "W1"], [f"{name}_mm"], name=f"{name}_fc1"),
            helper.make_node("Add", [f"{name}_mm", "b1"], [f"{name}_pre"]),
            helper.make_node(act, [f"{name}_pre"], [f"{name}_h"]),
            helper.make_node("MatMul", [f"{name}_h", head], [f"{name}_out"], name=f"{name}_fc2"),
        ]
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["batch", classes])
        return helper.make_graph(nodes, name, [], [out])

    node = helper.make_node(
        "If",
        ["use_relu"],
        ["logits"],
        name="gate",
        then_branch=branch("relu_branch", "Relu", "W2"),
        else_branch=branch("tanh_branch", "Tanh", "W3"),
    )
    graph = helper.make_graph(
        [node],
        "gated_by_if",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features]),
            helper.make_tensor_value_info("use_relu", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def rank_unknown_inside(path: Path) -> Path:
    """y = LpNormalization(Reshape(x, shape)): ``shape`` has a dynamic length, so the rank of the
    reshaped tensor is unknown until run time. onnxruntime runs it; OpenVINO's frontend cannot
    convert LpNormalization without a known rank ("Cannot get length of dynamic dimension")."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["reshaped"], name="reshape"),
        helper.make_node("LpNormalization", ["reshaped"], ["y"], name="normalize", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "rank_unknown_inside",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, ["rank"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def tiny_convnet(path: Path, *, convs: int = 1, seed: int = 0) -> Path:
    """logits = Gemm(GlobalAveragePool(conv2?(relu(conv1(x))))): ``convs`` 1 or 2 (8 channels)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
    ]
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
    }
    last = "r1"
    if convs == 2:
        nodes.append(helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
        inits["w2"] = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
        inits["b2"] = rng.standard_normal(8).astype(np.float32)
        last = "c2"
    nodes += [
        helper.make_node("GlobalAveragePool", [last], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
    ]
    inits["fc"] = rng.standard_normal((10, 8)).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def convnet_source(path: Path, example: np.ndarray) -> Any:
    """The converters' SourceModel of a :func:`tiny_convnet` file, ``example`` its golden input."""
    from edgesdk.converters.base import SourceModel

    from edgesdk.schemas.manifest import TensorSpec

    return SourceModel(
        "convnet",
        str(path),
        path,
        [TensorSpec(name="x", dtype="float32", shape=["batch", 3, 8, 8])],
        [TensorSpec(name="logits", dtype="float32", shape=["batch", 10])],
        {"x": example},
    )
