"""Fold a pipeline's normalization into an ONNX graph, so the runtime does it natively.

``(x * scale - mean) / std`` per channel is one ``Mul`` and one ``Add`` (``x * a + b`` with
``a = scale / std`` and ``b = -mean / std``) prepended on the model's first input. The input
keeps its name, dtype and shape; what it takes changes: the decoded pixels (0..255, after the
colour order, resize, crop and layout steps), no longer the normalized tensor. The pipeline
signed in the bundle says so (``folded: [normalize]``) and the agent skips the step.

Only normalization is folded. Resize is not: its input size is the decoded image's, which
varies per request, and a graph ``Resize`` would not match Pillow's filters to the pixel. A
softmax post step stays in numpy too: it is a few microseconds on 1000 classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import ConversionError
from edgesdk.schemas.pipeline import ImagePre

#: The steps a pipeline may name in ``folded`` that this module knows how to fold.
FOLDABLE = ("normalize",)


def affine(pre: ImagePre) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``a`` and ``b`` with ``x * a + b == (x * scale - mean) / std`` (float64)."""
    mean = np.asarray(pre.mean, np.float64)
    std = np.asarray(pre.std, np.float64)
    mean, std = np.broadcast_arrays(mean, std)
    return pre.scale / std, -mean / std


def fold_normalize(model: Any, pre: ImagePre) -> Any:
    """``model`` (an ``onnx.ModelProto``, changed in place and returned) with ``pre``'s
    normalization done by its first graph input's new ``Mul`` + ``Add``."""
    from onnx import helper, numpy_helper

    graph = model.graph
    constants = {t.name for t in graph.initializer}
    feeds = [i for i in graph.input if i.name not in constants]
    if not feeds:
        raise ConversionError("cannot fold normalization: the ONNX graph has no input")
    source = feeds[0]
    dtype = helper.tensor_dtype_to_np_dtype(source.type.tensor_type.elem_type)
    if dtype.kind != "f":
        raise ConversionError(
            f"cannot fold normalization into input {source.name!r} of dtype {dtype}: it must take floats"
        )
    a, b = affine(pre)
    shape = (1, a.size, 1, 1) if pre.layout == "NCHW" else (1, 1, 1, a.size)
    inner, scaled = f"{source.name}__normalized", f"{source.name}__scaled"
    for node in graph.node:  # every reader of the input now reads the normalized tensor
        node.input[:] = [inner if name == source.name else name for name in node.input]
    graph.initializer.extend(
        [
            numpy_helper.from_array(a.reshape(shape).astype(dtype), f"{source.name}__fold_mul"),
            numpy_helper.from_array(b.reshape(shape).astype(dtype), f"{source.name}__fold_add"),
        ]
    )
    steps = [
        helper.make_node("Mul", [source.name, f"{source.name}__fold_mul"], [scaled], name="fold_normalize_mul"),
        helper.make_node("Add", [scaled, f"{source.name}__fold_add"], [inner], name="fold_normalize_add"),
    ]
    for index, node in enumerate(steps):
        graph.node.insert(index, node)
    return model


def fold_onnx_file(path: Path, pre: ImagePre) -> None:
    """Fold normalization into the ``.onnx`` file at ``path`` (its external weights untouched)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.save(fold_normalize(model, pre), str(path))


def fold_artifact(files: dict[str, Path], pre: ImagePre) -> None:
    """Fold normalization into an ONNX variant's graph file (one ``.onnx`` among its files)."""
    graphs = [p for name, p in files.items() if name.endswith(".onnx")]
    if len(graphs) != 1:
        raise ConversionError(f"cannot fold normalization: expected one .onnx file, the variant has {sorted(files)}")
    fold_onnx_file(graphs[0], pre)


def raw_pixels(tensor: np.ndarray, pre: ImagePre) -> np.ndarray:
    """The inverse of the folded step: a normalized input back to the pixels a folded graph
    takes (the golden set's inputs, made from normalized validation data)."""
    a, b = affine(pre)
    shape = (1, a.size, 1, 1) if pre.layout == "NCHW" else (1, 1, 1, a.size)
    return ((tensor - b.reshape(shape)) / a.reshape(shape)).astype(tensor.dtype)
