"""Fold a pipeline's normalization (and the uint8 cast) into a ``.tflite`` flatbuffer.

The same graph edit as graph_fold.py makes in ONNX, in LiteRT's own ops: ``MUL`` and ``ADD``
by per-channel constants (``x * a + b``) prepended on the first input, and with the cast a
``CAST`` uint8 → float32 before them. The input tensor keeps its index, name and signature
entry (only its type changes with the cast); every op that read it reads the normalized tensor.
A full-integer model's quantized input is not folded: its first op already takes int8 codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.graph_fold import channel_shape, fold_constants
from edgesdk.converters.tflite_graph import _read, _schema, _write

from edgesdk.errors import ConversionError
from edgesdk.schemas.pipeline import ImagePre


def _opcode_index(graph: Any, builtin: int) -> int:
    """The index of ``builtin``'s operator code, added when the model has none yet."""
    fb = _schema()
    for index, code in enumerate(graph.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return index
    code = fb.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)  # the old int8 field: 127 means "see builtinCode"
    code.version = 1
    graph.operatorCodes.append(code)
    return len(graph.operatorCodes) - 1


def _tensor(graph: Any, subgraph: Any, name: str, shape: Any, dtype: int, data: np.ndarray | None = None) -> int:
    """A new tensor (a constant when ``data`` is given) in ``subgraph``; its index."""
    fb = _schema()
    buffer = fb.BufferT()
    if data is not None:
        buffer.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    graph.buffers.append(buffer)
    tensor = fb.TensorT()
    tensor.name, tensor.type, tensor.buffer = name, dtype, len(graph.buffers) - 1
    tensor.shape = np.asarray(shape, np.int32)
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _op(graph: Any, builtin: int, inputs: list[int], output: int, options: Any, options_type: int) -> Any:
    fb = _schema()
    op = fb.OperatorT()
    op.opcodeIndex = _opcode_index(graph, builtin)
    op.inputs, op.outputs = np.asarray(inputs, np.int32), np.asarray([output], np.int32)
    op.builtinOptions, op.builtinOptionsType = options, options_type
    return op


def fold_tflite(model: bytes, pre: ImagePre, cast: bool = False) -> bytes:
    """``model`` with ``pre``'s normalization (and, with ``cast``, the uint8 → float32 cast)
    done by new ops on its first subgraph's first input."""
    fb = _schema()
    graph = _read(model)
    subgraph = graph.subgraphs[0]
    index = int(subgraph.inputs[0])
    source = subgraph.tensors[index]
    name = source.name.decode() if isinstance(source.name, bytes) else str(source.name)
    if source.type != fb.TensorType.FLOAT32:
        kind = {v: k for k, v in vars(fb.TensorType).items() if k.isupper()}.get(source.type, str(source.type))
        raise ConversionError(
            f"cannot fold normalization into input {name!r}: it takes {kind.lower()}, not float32"
            " (a full-integer model's input is quantized)"
        )
    shape = [int(d) for d in source.shape]
    a, b = fold_constants(pre, np.float32)
    constant = channel_shape(pre, a.size)
    ops = []
    pixels = index
    if cast:
        pixels = _tensor(graph, subgraph, f"{name}__pixels", shape, fb.TensorType.FLOAT32)
        options = fb.CastOptionsT()
        options.inDataType, options.outDataType = fb.TensorType.UINT8, fb.TensorType.FLOAT32
        ops.append(_op(graph, fb.BuiltinOperator.CAST, [index], pixels, options, fb.BuiltinOptions.CastOptions))
    mul = _tensor(graph, subgraph, f"{name}__fold_mul", constant, fb.TensorType.FLOAT32, a.reshape(constant))
    add = _tensor(graph, subgraph, f"{name}__fold_add", constant, fb.TensorType.FLOAT32, b.reshape(constant))
    scaled = _tensor(graph, subgraph, f"{name}__scaled", shape, fb.TensorType.FLOAT32)
    normalized = _tensor(graph, subgraph, f"{name}__normalized", shape, fb.TensorType.FLOAT32)
    for op in subgraph.operators:  # every reader of the input now reads the normalized tensor
        if op.inputs is not None:
            op.inputs = np.where(np.asarray(op.inputs) == index, normalized, op.inputs).astype(np.int32)
    ops.append(
        _op(graph, fb.BuiltinOperator.MUL, [pixels, mul], scaled, fb.MulOptionsT(), fb.BuiltinOptions.MulOptions)
    )
    ops.append(
        _op(graph, fb.BuiltinOperator.ADD, [scaled, add], normalized, fb.AddOptionsT(), fb.BuiltinOptions.AddOptions)
    )
    subgraph.operators = ops + list(subgraph.operators)
    if cast:
        source.type = fb.TensorType.UINT8
    return _write(graph)


def fold_tflite_file(path: Path, pre: ImagePre, cast: bool = False) -> None:
    """Fold into the ``.tflite`` file at ``path``, in place."""
    path.write_bytes(fold_tflite(path.read_bytes(), pre, cast))
