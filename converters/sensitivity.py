"""Per-layer int8 sensitivity, measured: which layers to keep in float when int8 misses its gate.

One pass of the fp32 ONNX and one of its fully quantized (static QDQ) version over a few
calibration samples, with every quantizable layer's output exposed. A layer's score is the
relative error it *adds*: the error of its output minus the error of its input. Accuracy-aware
repair keeps the top-ranked layers in float, doubling their number until the gate holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from edgesdk.converters.base import SourceModel
from edgesdk.converters.data import subset
from edgesdk.converters.onnx_backend import QUANTIZABLE_OPS, at_per_channel_opset


def _with_outputs(path: Path, names: list[str], out: Path) -> Path:
    import onnx

    model = onnx.load(str(path))
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    onnx.save_model(model, str(out))
    return out


def rank_layers(
    source: SourceModel, calibration: Mapping[str, np.ndarray], workdir: Path, samples: int = 32
) -> list[tuple[str, float]]:
    """(ONNX node name, added relative error), most sensitive first."""
    import onnx
    import onnxruntime as ort
    from edgesdk.converters.onnx_backend import _Calibration
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    workdir.mkdir(parents=True, exist_ok=True)
    # The probe's per-channel DequantizeLinear needs the opset the int8 builds raise the source to.
    source = at_per_channel_opset(source, workdir)
    fp32_graph = onnx.load(str(source.onnx_path)).graph
    layers = [n.name for n in fp32_graph.node if n.op_type in QUANTIZABLE_OPS and n.name]
    if not layers:
        return []
    quantized = workdir / "all-int8.onnx"
    quantize_static(
        str(source.onnx_path),
        str(quantized),
        _Calibration(calibration, source.layout),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    # The quantizer may rename a layer's tensors (e.g. fusing Conv+Clip), so each model's own
    # tensors are looked up through the node name: (input, output) per layer, per model.
    graph_inputs = {s.name for s in source.inputs}
    # A MatMul may take a weight as its first input: constants have no error to measure.
    constants = {i.name for i in fp32_graph.initializer}
    int8_nodes = {n.name: n for n in onnx.load(str(quantized)).graph.node}
    fp32_nodes = {n.name: n for n in fp32_graph.node}
    ends = {
        "fp32": {name: (fp32_nodes[name].input[0], fp32_nodes[name].output[0]) for name in layers},
        "int8": {
            name: (int8_nodes[name].input[0], int8_nodes[name].output[0]) for name in layers if name in int8_nodes
        },
    }
    data = subset(calibration, samples)
    runs: dict[str, dict[str, np.ndarray]] = {}
    for label, path in (("fp32", source.onnx_path), ("int8", quantized)):
        tensors = sorted({t for pair in ends[label].values() for t in pair} - graph_inputs - constants)
        probe = _with_outputs(path, tensors, workdir / f"probe-{label}.onnx")
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        per_sample = [dict(zip(names, session.run(names, feed))) for feed in source.layout.samples(data)]
        runs[label] = {t: np.concatenate([s[t] for s in per_sample]) for t in tensors}
        runs[label].update({t: data[t] for t in graph_inputs})

    def error(layer: str, end: int) -> float:
        if layer not in ends["int8"]:
            return 0.0
        ref_name, got_name = ends["fp32"][layer][end], ends["int8"][layer][end]
        if ref_name not in runs["fp32"] or got_name not in runs["int8"]:
            return 0.0
        ref = runs["fp32"][ref_name].astype(np.float64)
        got = runs["int8"][got_name].astype(np.float64)
        if got.shape != ref.shape:
            return 0.0
        return float(np.linalg.norm(got - ref) / (np.linalg.norm(ref) + 1e-12))

    scores = [(name, error(name, 1) - error(name, 0)) for name in layers]
    return sorted(scores, key=lambda item: item[1], reverse=True)


_INDEXED = re.compile(r"^[A-Za-z_]+[._]?\d+$")


def block_of(layer: str) -> str:
    """The block a layer belongs to, from its exported name: the path up to the first indexed
    module (``/features/features.3/conv/...`` → ``/features/features.3``; BERT's
    ``/bert/encoder/layer.0/attention/...`` → ``/bert/encoder/layer.0``); the layer itself
    when its name has no such part."""
    parts = layer.split("/")
    for index, part in enumerate(parts):
        if index and _INDEXED.match(part):
            return "/".join(parts[: index + 1])
    return layer


def block_rounds(ranking: list[str], allowed: list[str], limit: int) -> list[tuple[str, list[str]]]:
    """Repair rounds that keep *whole blocks* in float: the block of the most sensitive layer,
    then of the two most sensitive, ... as long as they hold at most ``limit`` layers.

    Keeping one layer of a block in float can leave the error in the int8 activations around
    it (measured on MobileNetV2's inverted residuals); keeping the block removes them."""
    blocks: list[str] = []
    rounds: list[tuple[str, list[str]]] = []
    for layer in ranking:
        block = block_of(layer)
        if block == layer or block in blocks:
            continue
        blocks.append(block)
        layers = [name for name in allowed if any(block_of(name) == b for b in blocks)]
        if len(layers) > limit:
            break
        rounds.append((", ".join(blocks), layers))
        if len(blocks) == 3:
            break
    return rounds
