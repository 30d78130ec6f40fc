"""Fold a pipeline's normalization (and the uint8 input cast) into an ONNX graph, so the
runtime does it natively; the other formats' folds sit beside this file (fold_tflite.py,
fold_openvino.py) and ``fold_artifact`` picks the one of a variant's format.

``(x * scale - mean) / std`` per channel is one ``Mul`` and one ``Add`` (``x * a + b`` with
``a = scale / std`` and ``b = -mean / std``) prepended on the model's first input. The input
keeps its name, dtype and shape; what it takes changes: the decoded pixels (0..255, after the
colour order, resize, crop and layout steps), no longer the normalized tensor. The pipeline
signed in the bundle says so (``folded: [normalize]``) and the agent skips the step.

With ``cast`` (``folded: [normalize, cast]``) the input's dtype becomes uint8 and a ``Cast``
to the old float dtype comes first: the agent hands the decoder's uint8 pixels as they are,
with no float32 copy in numpy (a quarter of the bytes, and the runtime's own cast).

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
FOLDABLE = ("normalize", "cast")
#: How near a whole value an un-normalized pixel is taken as that value (raw_pixels).
WHOLE = 1e-2


def affine(pre: ImagePre) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``a`` and ``b`` with ``x * a + b == (x * scale - mean) / std`` (float64)."""
    mean = np.asarray(pre.mean, np.float64)
    std = np.asarray(pre.std, np.float64)
    mean, std = np.broadcast_arrays(mean, std)
    return pre.scale / std, -mean / std


def fold_constants(pre: ImagePre, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``affine``'s ``a`` and ``b`` as flat arrays of ``dtype``."""
    a, b = affine(pre)
    return a.astype(dtype).ravel(), b.astype(dtype).ravel()


def channel_shape(pre: ImagePre, channels: int) -> tuple[int, int, int, int]:
    """The shape that broadcasts per-channel constants over a batch in ``pre``'s layout."""
    return (1, channels, 1, 1) if pre.layout == "NCHW" else (1, 1, 1, channels)


def fold_normalize(model: Any, pre: ImagePre, cast: bool = False) -> Any:
    """``model`` (an ``onnx.ModelProto``, changed in place and returned) with ``pre``'s
    normalization done by its first graph input's new ``Mul`` + ``Add`` (after a ``Cast`` from
    uint8, the input's new dtype, with ``cast``)."""
    from onnx import TensorProto, helper, numpy_helper

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
    shape = channel_shape(pre, a.size)
    inner, scaled = f"{source.name}__normalized", f"{source.name}__scaled"
    pixels = f"{source.name}__pixels" if cast else source.name
    for node in graph.node:  # every reader of the input now reads the normalized tensor
        node.input[:] = [inner if name == source.name else name for name in node.input]
    graph.initializer.extend(
        [
            numpy_helper.from_array(a.reshape(shape).astype(dtype), f"{source.name}__fold_mul"),
            numpy_helper.from_array(b.reshape(shape).astype(dtype), f"{source.name}__fold_add"),
        ]
    )
    steps = [
        helper.make_node("Mul", [pixels, f"{source.name}__fold_mul"], [scaled], name="fold_normalize_mul"),
        helper.make_node("Add", [scaled, f"{source.name}__fold_add"], [inner], name="fold_normalize_add"),
    ]
    if cast:
        float_type = source.type.tensor_type.elem_type
        steps.insert(0, helper.make_node("Cast", [source.name], [pixels], to=float_type, name="fold_cast"))
        source.type.tensor_type.elem_type = TensorProto.UINT8
    for index, node in enumerate(steps):
        graph.node.insert(index, node)
    return model


def fold_onnx_file(path: Path, pre: ImagePre, cast: bool = False) -> None:
    """Fold normalization into the ``.onnx`` file at ``path`` (its external weights untouched)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.save(fold_normalize(model, pre, cast), str(path))


#: Per format: the graph file's suffix, and the module + function that fold that file in place
#: (returning the variant's new file listing when the fold changed which files it has).
FOLDERS = {
    "onnx": (".onnx", "edgesdk.converters.graph_fold", "fold_onnx_file"),
    "tflite": (".tflite", "edgesdk.converters.fold_tflite", "fold_tflite_file"),
    "openvino": (".xml", "edgesdk.converters.fold_openvino", "fold_openvino_file"),
    "coreml": ("/model.mlmodel", "edgesdk.converters.fold_coreml", "fold_coreml_file"),
}
#: The formats whose fold also casts uint8 (a Core ML multiarray takes no uint8: fold_coreml.py).
CASTS = ("onnx", "tflite", "openvino")


def fold_artifact(files: dict[str, Path], pre: ImagePre, fmt: str = "onnx", cast: bool = False) -> None:
    """Fold normalization (and the cast) into a variant's graph file of format ``fmt``."""
    import importlib

    if fmt not in FOLDERS:
        raise ConversionError(f"cannot fold normalization into a {fmt} variant: folds are done for {sorted(FOLDERS)}")
    suffix, module, function = FOLDERS[fmt]
    graphs = [p for name, p in files.items() if name.endswith(suffix)]
    if len(graphs) != 1:
        raise ConversionError(f"cannot fold normalization: expected one {suffix} file, the variant has {sorted(files)}")
    listing = getattr(importlib.import_module(module), function)(graphs[0], pre, cast)
    if listing is not None:
        files.clear()
        files.update(listing)


def raw_pixels(tensor: np.ndarray, pre: ImagePre) -> np.ndarray:
    """The inverse of the folded step: a normalized input back to the pixels a folded graph
    takes (the golden set's inputs, made from normalized validation data). Values within
    ``WHOLE`` of a whole pixel are that pixel: the float error of the normalization must not
    reach a uint8 input as 254.99998, which the agent's cast would truncate to 254."""
    a, b = affine(pre)
    shape = channel_shape(pre, a.size)
    pixels = (tensor - b.reshape(shape)) / a.reshape(shape)
    whole = np.rint(pixels)
    return np.where(np.abs(pixels - whole) <= WHOLE, whole, pixels).astype(tensor.dtype)
