"""Fold a pipeline's normalization (and the uint8 cast) into an OpenVINO IR, the way OpenVINO
does it: ``ov.preprocess.PrePostProcessor`` on the first input, built into the model and saved
with it, so the runtime's own preprocessing ops normalize (and convert the element type).

``(x * scale - mean) / std`` is ``(x - mean / scale) / (std / scale)``: the PrePostProcessor's
``mean`` then ``scale`` per channel, with the input's layout (the pipeline's) telling it which
axis is the channel. With the cast the tensor's element type is u8 and ``convert_element_type``
goes back to the model's float type first. The weights are saved as they were (fp32, fp16
compressed or int8), never recompressed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from edgesdk.converters.graph_fold import affine

from edgesdk.errors import ConversionError
from edgesdk.schemas.pipeline import ImagePre


def _values(per_channel: np.ndarray) -> float | list[float]:
    """One value for every channel as a scalar (the PrePostProcessor's broadcast), else the list."""
    flat = [float(v) for v in np.ravel(per_channel)]
    return flat[0] if len(flat) == 1 else flat


def fold_openvino(model: object, pre: ImagePre, cast: bool = False) -> object:
    """``model`` (an ``ov.Model``) with ``pre``'s normalization built in by a PrePostProcessor."""
    import openvino as ov
    from openvino.preprocess import PrePostProcessor

    first = model.inputs[0]  # type: ignore[attr-defined]
    element = first.get_element_type()
    if not element.is_real():
        raise ConversionError(
            f"cannot fold normalization into input {first.get_any_name()!r} of type {element}: it must take floats"
        )
    a, b = affine(pre)
    # x * a + b == (x - mean') / scale' with scale' = 1 / a and mean' = -b / a.
    mean, scale = _values(-b / a), _values(1.0 / a)
    ppp = PrePostProcessor(model)
    entry = ppp.input(0)
    entry.tensor().set_layout(ov.Layout(pre.layout))
    entry.model().set_layout(ov.Layout(pre.layout))
    if cast:
        entry.tensor().set_element_type(ov.Type.u8)
        entry.preprocess().convert_element_type(element)
    entry.preprocess().mean(mean).scale(scale)
    return ppp.build()


def fold_openvino_file(path: Path, pre: ImagePre, cast: bool = False) -> None:
    """Fold into the IR at ``path`` (``model.xml`` and its ``model.bin``), rewritten in place."""
    import openvino as ov

    model = ov.Core().read_model(str(path))
    folded = fold_openvino(model, pre, cast)
    staged = path.with_name(f"{path.stem}.folded.xml")
    ov.save_model(folded, str(staged), compress_to_fp16=False)  # the weights as they were
    del model, folded  # read_model maps the old .bin: release it before it is replaced
    staged.replace(path)
    staged.with_suffix(".bin").replace(path.with_suffix(".bin"))
