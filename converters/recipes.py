"""Model families and the int8 recipes worth trying for each, per converter.

One int8 recipe does not fit every model. Measured on held-out models (docs/converters.md):
a transformer encoder loses its accuracy when attention scores, Gather, LayerNorm and the
residual stream are quantized (naive static QDQ) or when FFN output weights with outlier
columns share one scale (per-tensor dynamic int8); per-channel dynamic int8, weight-only int8
(MatMulNBits) and NNCF's transformer mode (SmoothQuant) hold. A convnet needs per-channel
weights and a calibration that is robust to outliers (percentile), or bias correction, or
cross-layer equalization. So the graph is read once, classified, and the planner asks this
module which recipes to build; each is then validated in the device's runtime like any other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class Family(str, Enum):
    TRANSFORMER = "transformer"
    CONVNET = "convnet"
    OTHER = "other"


@dataclass(frozen=True)
class GraphTraits:
    """Counts that tell the families apart, read from the ONNX graph."""

    convs: int
    weight_matmuls: int  # MatMul/Gemm whose second input is a weight (an initializer, maybe via a cast)
    activation_matmuls: int  # MatMul of two activations: attention scores and their weighted sum
    softmaxes: int
    layer_norms: int  # LayerNormalization, or its decomposition (ReduceMean → Sub → Pow → ... → Div)
    embedding_gathers: int  # Gather from an initializer table

    def describe(self) -> str:
        return (
            f"{self.convs} Conv, {self.weight_matmuls} weight MatMul/Gemm, {self.activation_matmuls} activation "
            f"MatMul, {self.softmaxes} Softmax, {self.layer_norms} LayerNorm, {self.embedding_gathers} embedding Gather"
        )


def read_traits(onnx_path: Path) -> GraphTraits:
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    # A weight may reach its MatMul through Transpose/Cast/DequantizeLinear of an initializer.
    for node in graph.node:
        if node.op_type in ("Transpose", "Cast", "DequantizeLinear", "Identity") and node.input[0] in weights:
            weights.update(node.output)
    for node in graph.node:
        if node.op_type == "Constant":
            weights.update(node.output)
    ops = Counter(n.op_type for n in graph.node)
    weight_mm = activation_mm = gathers = 0
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            if any(name in weights for name in node.input[:2]):
                weight_mm += 1
            else:
                activation_mm += 1
        elif node.op_type == "Gather" and node.input[0] in weights:
            gathers += 1
    # The legacy exporter writes LayerNorm as ReduceMean pairs; one LayerNorm = two ReduceMeans + a Sqrt.
    decomposed = min(ops["ReduceMean"] // 2, ops["Sqrt"])
    return GraphTraits(
        convs=ops["Conv"] + ops["ConvTranspose"],
        weight_matmuls=weight_mm,
        activation_matmuls=activation_mm,
        softmaxes=ops["Softmax"],
        layer_norms=ops["LayerNormalization"] + ops["SimplifiedLayerNormalization"] + decomposed,
        embedding_gathers=gathers,
    )


def classify(traits: GraphTraits) -> tuple[Family, str]:
    """The family and the sentence that says why (for the report)."""
    attention = traits.activation_matmuls >= 2 and traits.softmaxes >= 1
    if attention or (traits.layer_norms >= 1 and traits.weight_matmuls >= 2 and traits.convs == 0):
        why = "attention (activation×activation MatMul + Softmax)" if attention else "LayerNorm + weight MatMuls"
        return Family.TRANSFORMER, f"transformer-like graph: {why}; {traits.describe()}"
    if traits.convs > 0:
        return Family.CONVNET, f"convnet: {traits.describe()}"
    return Family.OTHER, f"neither attention nor convolutions: {traits.describe()}"


def detect_family(onnx_path: Path) -> tuple[Family, str]:
    return classify(read_traits(onnx_path))


#: int8 recipes per converter and family, in order of preference (the planner keeps the fastest
#: that holds the gate, so the order matters only where speed cannot be measured).
#: Every name must be one of the converter's declared ``int8_methods`` (a unit test checks).
RECIPES: dict[str, dict[Family, tuple[str, ...]]] = {
    "onnx": {
        Family.TRANSFORMER: (
            "dynamic-int8-per-channel",
            "weight-only-int8",
            "static-qdq-weight-matmuls",
            "dynamic-int8",
        ),
        Family.CONVNET: (
            "static-qdq-per-channel",
            "static-qdq-percentile",
            "static-qdq-u8",
            "static-qdq-percentile-u8",
            "nncf-qdq",
            "cle-static-qdq",
        ),
        Family.OTHER: ("static-qdq-per-channel", "nncf-qdq", "dynamic-int8"),
    },
    "openvino": {
        Family.TRANSFORMER: ("nncf-ptq-transformer", "nncf-weights-int8"),
        Family.CONVNET: ("nncf-ptq", "nncf-ptq-bias-correction", "nncf-ptq-accuracy-control"),
        Family.OTHER: ("nncf-ptq", "nncf-weights-int8"),
    },
    "tflite": {
        Family.TRANSFORMER: ("dynamic-int8", "static-int8-full-integer"),
        Family.CONVNET: ("static-int8-full-integer", "dynamic-int8"),
        Family.OTHER: ("static-int8-full-integer", "dynamic-int8"),
    },
}

#: What each recipe is, for the report and ``edgesdk convert --help``.
RECIPE_NOTES: dict[str, str] = {
    "static-qdq-per-channel": "ORT static QDQ, per-channel weights, min-max calibration",
    "static-qdq-percentile": "ORT static QDQ, per-channel weights, percentile 99.999 calibration",
    "static-qdq-u8": "ORT static QDQ, per-channel weights, uint8 activations (U8S8), min-max calibration",
    "static-qdq-percentile-u8": "ORT static QDQ, per-channel weights, uint8 activations (U8S8), percentile 99.999",
    "static-qdq-weight-matmuls": "ORT static QDQ on weight MatMuls only, their outputs left float",
    "cle-static-qdq": "cross-layer equalization (aimet-onnx) then ORT static QDQ per-channel",
    "nncf-qdq": "NNCF post-training QDQ on the ONNX graph",
    "dynamic-int8": "ORT dynamic int8, per-tensor weights",
    "dynamic-int8-per-channel": "ORT dynamic int8, per-channel weights",
    "weight-only-int8": "ORT MatMulNBits 8-bit weights, block 128, int8 compute (accuracy_level 4)",
    "nncf-ptq": "NNCF post-training quantization, fast bias correction",
    "nncf-ptq-bias-correction": "NNCF post-training quantization, full bias correction, mixed preset",
    "nncf-ptq-accuracy-control": "NNCF accuracy control: ops back to float (at most 12) until top-1 agreement "
    "with fp32 on the calibration samples drops by at most 0.05",
    "nncf-ptq-transformer": "NNCF post-training quantization, ModelType.TRANSFORMER (SmoothQuant)",
    "nncf-weights-int8": "NNCF compress_weights INT8_ASYM (weights only, float activations)",
    "static-int8-full-integer": "ai-edge-quantizer / litert static int8, int8 I/O",
    "linear-weights-int8": "coremltools 8-bit linear weights",
    "palettized-weights-8bit": "coremltools 8-bit palettized weights",
}


def recipes_for(converter: str, family: Family, declared: tuple[str, ...]) -> tuple[str, ...]:
    """The converter's recipes for ``family``; a converter without a table keeps its declared list."""
    table = RECIPES.get(converter)
    if table is None:
        return declared
    return tuple(m for m in table[family] if m in declared)
