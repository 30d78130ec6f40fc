"""Weights held as ``Constant`` nodes, moved into initializers before anything converts the model.

paddle2onnx (and some tf2onnx and hand-built exports) write every weight as a ``Constant`` node
and leave the graph with no initializer at all. The same network, the same numbers, but the
tools downstream look for weights among the initializers only: onnxruntime's quantizer finds
nothing to quantize (an "int8" no smaller than fp32), NNCF and onnx2torch stop on "Expected …
to be an initializer" or a bare ``KeyError``. Moving each tensor-valued ``Constant`` into an
initializer of the same name changes no output and gives every tool the weights it looks for.

Constants inside control-flow bodies (``If``/``Loop``/``Scan`` subgraphs) go to that subgraph's
own initializers: a subgraph may hold initializers, and the name stays visible only where it was.
"""

from __future__ import annotations

from typing import Any

#: An ONNX IR before version 4 requires every initializer to be a graph input too.
_INITIALIZERS_ARE_INPUTS_BEFORE_IR = 4


def fold_constant_weights(model: Any) -> int:
    """Move every tensor-valued ``Constant`` node of ``model`` (an ``onnx.ModelProto``, changed
    in place) into an initializer; returns how many were moved."""
    return _fold(model.graph, as_inputs=model.ir_version < _INITIALIZERS_ARE_INPUTS_BEFORE_IR)


def _fold(graph: Any, as_inputs: bool) -> int:
    import onnx

    folded = 0
    moved = []
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                folded += _fold(attribute.g, as_inputs)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                folded += sum(_fold(g, as_inputs) for g in attribute.graphs)
        tensor = _tensor_value(node)
        if tensor is None:
            continue
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        if as_inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
        moved.append(index)
    for index in reversed(moved):  # in place, last first: the other nodes keep their order
        del graph.node[index]
    return folded + len(moved)


def _tensor_value(node: Any) -> Any:
    """A copy of the tensor a ``Constant`` node of the default domain holds in ``value``, else None
    (``value_float``, ``sparse_value`` and the like stay nodes: no tool expects them as weights)."""
    import onnx

    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    values = [a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
    if len(node.attribute) != 1 or not values:
        return None
    copy = onnx.TensorProto()
    copy.CopyFrom(values[0].t)
    return copy
