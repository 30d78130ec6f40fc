"""Reading and rewriting a ``.tflite`` flatbuffer as on-device frameworks ship it (issue 38).

MediaPipe's models have no SignatureDef (LiteRT runs them by tensor index) and store their
weights as float16 constants, each feeding a DEQUANTIZE op that LiteRT expands to float32 at
load: fp16 *storage*, fp32 *compute*. This module tells that apart from fp16 compute (float16
activations), adds the serving signature ai-edge-quantizer needs (named by the tensors, as
the runtime names a signature-less model's I/O), and makes the real fp32 model by doing the
dequantization once, ahead of time (exact: every float16 value is a float32 value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: The signature key ai-edge-quantizer and the runtime use (tflite_backend.SIGNATURE).
SIGNATURE = "serving_default"
#: Metadata that lets a delegate run the model in reduced precision (fp16): a real fp32 drops it.
_REDUCED_PRECISION = b"reduced_precision_support"


def _schema() -> Any:
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def _read(model: bytes) -> Any:
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.read_model_from_bytearray(bytearray(model))


def _write(graph: Any) -> bytes:
    from ai_edge_litert.tools import flatbuffer_utils

    return bytes(flatbuffer_utils.convert_object_to_bytearray(graph))


def _opcode(graph: Any, op: Any) -> int:
    from ai_edge_litert.tools import flatbuffer_utils

    return int(flatbuffer_utils.get_builtin_code_from_operator_code(graph.operatorCodes[op.opcodeIndex]))


def _has_data(graph: Any, tensor: Any) -> bool:
    data = graph.buffers[tensor.buffer].data if tensor.buffer < len(graph.buffers) else None
    return data is not None and len(data) > 0


def _name(tensor: Any) -> str:
    name = tensor.name
    return name.decode() if isinstance(name, bytes) else str(name)


@dataclass(frozen=True)
class Fp16Content:
    """How many float16 tensors a .tflite holds, by what they are for."""

    stored_weights: int  # float16 constants that only feed DEQUANTIZE (fp32 compute)
    computed: int  # float16 tensors an op computes with (activations, or constants fed to other ops)

    @property
    def storage_only(self) -> bool:
        return self.stored_weights > 0 and self.computed == 0


def fp16_content(model: bytes) -> Fp16Content:
    """Float16 constants feeding DEQUANTIZE are storage; so are sparse ones (MediaPipe's
    pose_detection) feeding DENSIFY whose dense float16 output only feeds DEQUANTIZE."""
    fb = _schema()
    graph = _read(model)
    stored = computed = 0
    for subgraph in graph.subgraphs:
        consumers: dict[int, set[int]] = {}
        produced = {int(i) for op in subgraph.operators for i in (op.outputs if op.outputs is not None else [])}
        for op in subgraph.operators:
            for index in op.inputs if op.inputs is not None else []:
                if index >= 0:
                    consumers.setdefault(int(index), set()).add(_opcode(graph, op))
        densified = {
            int(op.outputs[0]): int(op.inputs[0])
            for op in subgraph.operators
            if _opcode(graph, op) == fb.BuiltinOperator.DENSIFY
            and consumers.get(int(op.outputs[0]), set()) <= {fb.BuiltinOperator.DEQUANTIZE}
        }
        for index, tensor in enumerate(subgraph.tensors):
            if tensor.type != fb.TensorType.FLOAT16 or (index not in consumers and index not in produced):
                continue  # not float16, or a tensor no op touches
            if index in densified:
                continue  # the dense copy of a sparse weight, counted as that weight
            feeds = consumers.get(index, set())
            if _has_data(graph, tensor) and feeds <= {fb.BuiltinOperator.DEQUANTIZE}:
                stored += 1
            elif _has_data(graph, tensor) and feeds == {fb.BuiltinOperator.DENSIFY} and index in densified.values():
                stored += 1
            else:
                computed += 1
    return Fp16Content(stored, computed)


def with_signature(model: bytes) -> bytes:
    """``model`` with a serving signature over its first subgraph's I/O, named by the tensors;
    ``model`` itself when it has signatures already."""
    fb = _schema()
    graph = _read(model)
    if graph.signatureDefs:
        return model
    subgraph = graph.subgraphs[0]
    signature = fb.SignatureDefT()
    signature.signatureKey = SIGNATURE
    signature.subgraphIndex = 0
    signature.inputs, signature.outputs = [], []
    for indices, into in ((subgraph.inputs, signature.inputs), (subgraph.outputs, signature.outputs)):
        for index in indices:
            entry = fb.TensorMapT()
            entry.name = _name(subgraph.tensors[index])
            entry.tensorIndex = int(index)
            into.append(entry)
    graph.signatureDefs = [signature]
    return _write(graph)


def with_builtin_codes(model: bytes) -> bytes:
    """``model`` with every operator code's ``builtin_code`` set as the schema defines it, the
    larger of it and ``deprecated_builtin_code``. Older converters (MediaPipe's iris, face
    models) wrote only the deprecated field; ai-edge-quantizer reads ``builtin_code`` alone, so
    every op looked like ADD (code 0) and conv weights got an activation's asymmetric per-tensor
    int8, which LiteRT's CONV_2D refuses (zero point != 0). ``model`` itself when none differ."""
    graph = _read(model)
    stale = [code for code in graph.operatorCodes or [] if code.builtinCode < code.deprecatedBuiltinCode]
    if not stale:
        return model
    for code in stale:
        code.builtinCode = code.deprecatedBuiltinCode
    return _write(graph)


def asymmetric_int8_weights(model: bytes) -> list[str]:
    """The int8 weights of conv and fully-connected ops with a zero point other than 0: LiteRT's
    int8 kernels refuse them when the model loads ("conv.cc ... zero_point != 0")."""
    fb = _schema()
    graph = _read(model)
    ops = {
        fb.BuiltinOperator.CONV_2D,
        fb.BuiltinOperator.DEPTHWISE_CONV_2D,
        fb.BuiltinOperator.FULLY_CONNECTED,
        fb.BuiltinOperator.TRANSPOSE_CONV,
    }
    weight_at = {fb.BuiltinOperator.TRANSPOSE_CONV: 1}  # (output_shape, weights, input)
    found = []
    for subgraph in graph.subgraphs:
        for op in subgraph.operators:
            code = _opcode(graph, op)
            if code not in ops:
                continue
            weight = subgraph.tensors[op.inputs[weight_at.get(code, 1)]]
            zero = weight.quantization.zeroPoint if weight.quantization is not None else None
            if weight.type == fb.TensorType.INT8 and zero is not None and np.any(np.asarray(zero) != 0):
                found.append(_name(weight))
    return found


def dequantize_fp16_weights(model: bytes) -> bytes:
    """``model`` with every float16 constant → DEQUANTIZE pair replaced by a float32 constant:
    what LiteRT computes with after its load, so the outputs are bit-identical."""
    fb = _schema()
    graph = _read(model)
    dequantize = fb.BuiltinOperator.DEQUANTIZE
    for number, subgraph in enumerate(graph.subgraphs):
        # A sparse weight: DENSIFY's output (no data) is what DEQUANTIZE reads.
        sparse_of = {
            int(op.outputs[0]): subgraph.tensors[op.inputs[0]]
            for op in subgraph.operators
            if _opcode(graph, op) == fb.BuiltinOperator.DENSIFY
        }
        kept = []
        for op in subgraph.operators:
            source = subgraph.tensors[op.inputs[0]] if _opcode(graph, op) == dequantize else None
            source = sparse_of.get(int(op.inputs[0]), source) if source is not None else None
            if source is None or source.type != fb.TensorType.FLOAT16 or not _has_data(graph, source):
                kept.append(op)
                continue
            values = np.frombuffer(np.asarray(graph.buffers[source.buffer].data, np.uint8).tobytes(), np.float16)
            if source.sparsity is not None:
                values = densify(source, values)
            target = subgraph.tensors[op.outputs[0]]
            buffer = fb.BufferT()
            buffer.data = np.frombuffer(values.astype(np.float32).tobytes(), np.uint8)
            graph.buffers.append(buffer)
            target.buffer = len(graph.buffers) - 1
        read = {int(i) for op in kept for i in (op.inputs if op.inputs is not None else [])}
        read |= {int(i) for i in subgraph.outputs}
        # A DENSIFY whose dense weight no op reads any more goes too.
        subgraph.operators = [
            op for op in kept if _opcode(graph, op) != fb.BuiltinOperator.DENSIFY or int(op.outputs[0]) in read
        ]
        _drop_unused_fp16(graph, number, subgraph)
    graph.metadata = [m for m in graph.metadata or [] if m.name != _REDUCED_PRECISION] or None
    return _write(graph)


def densify(tensor: Any, values: np.ndarray) -> np.ndarray:
    """The dense array of a sparse tensor (TFLite's SparsityParameters): the dimensions walked in
    traversal order, DENSE ones by their size, SPARSE_CSR ones by their segments and indices."""
    sparsity = tensor.sparsity
    if sparsity.blockMap is not None and len(sparsity.blockMap):
        raise ValueError(
            f"tensor {_name(tensor)!r} is sparse with a block map, which edgesdk cannot densify; "
            "export the model without sparsity"
        )
    coords = np.zeros((1, 0), np.int64)  # one position per stored value, so far: the root
    for meta in sparsity.dimMetadata:
        if meta.format == _schema().DimensionType.DENSE:
            size = int(meta.denseSize)
            coords = np.column_stack([np.repeat(coords, size, 0), np.tile(np.arange(size), len(coords))])
        else:
            segments = np.asarray(meta.arraySegments.values, np.int64)
            indices = np.asarray(meta.arrayIndices.values, np.int64)
            coords = np.column_stack([np.repeat(coords, np.diff(segments), 0), indices[segments[0] : segments[-1]]])
    dense = np.zeros([int(d) for d in tensor.shape], values.dtype)
    where: list[np.ndarray] = [np.empty(0)] * dense.ndim
    for level, dim in enumerate(sparsity.traversalOrder):
        where[int(dim)] = coords[:, level]
    dense[tuple(where)] = values[: len(coords)]
    return dense


def _drop_unused_fp16(graph: Any, number: int, subgraph: Any) -> None:
    """Take out the float16 constants no op reads any more, and their data: an unread tensor
    without data would be an unallocated one, which ai-edge-quantizer's calibration trips on."""
    fb = _schema()
    lists = [op.inputs for op in subgraph.operators] + [op.outputs for op in subgraph.operators]
    lists += [op.intermediates for op in subgraph.operators] + [subgraph.inputs, subgraph.outputs]
    used = {int(i) for indices in lists if indices is not None for i in indices if i >= 0}
    gone = [i for i, t in enumerate(subgraph.tensors) if t.type == fb.TensorType.FLOAT16 and i not in used]
    if not gone:
        return
    shared = {subgraph.tensors[i].buffer for i in used}
    for index in gone:
        if subgraph.tensors[index].buffer not in shared:
            graph.buffers[subgraph.tensors[index].buffer].data = None
    new_index = {old: new for new, old in enumerate(i for i in range(len(subgraph.tensors)) if i not in set(gone))}

    def remap(indices: Any) -> list[int] | None:
        return None if indices is None else [new_index[int(i)] if i >= 0 else int(i) for i in indices]

    for op in subgraph.operators:
        op.inputs, op.outputs, op.intermediates = remap(op.inputs), remap(op.outputs), remap(op.intermediates)
    subgraph.inputs, subgraph.outputs = remap(subgraph.inputs), remap(subgraph.outputs)
    subgraph.tensors = [t for i, t in enumerate(subgraph.tensors) if i in new_index]
    for signature in graph.signatureDefs or []:
        if signature.subgraphIndex == number:
            for entry in [*(signature.inputs or []), *(signature.outputs or [])]:
                entry.tensorIndex = new_index[entry.tensorIndex]
