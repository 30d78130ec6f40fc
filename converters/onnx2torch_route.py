"""ONNX → PyTorch with onnx2torch, so an ``.onnx`` source reaches TFLite through litert-torch.

The light route to TFLite (a pure-Python wheel instead of onnx2tf's ≈2.6 GB venv); onnx2tf
stays the fallback when this route cannot express the graph. Measured coverage (docs/converters.md):
the digits CNN and MobileNetV2 convert and match onnxruntime to ~1e-5; a BERT-class encoder
(MiniLM) does not — its Reshape/Expand take shapes computed at run time, which torch.export
cannot trace.

onnx2torch 1.5.15 needs four things here, each kept to this module:

* It imports torchvision for two converters (NonMaxSuppression, RoiAlign), and torchvision
  does not import beside the CPU torch (docs/converters.md). So it is installed without
  dependencies, and while it is imported a stand-in ``torchvision`` whose ops raise is put in
  ``sys.modules`` — and taken out again, so nothing else (transformers) believes torchvision
  is there. A graph with those two ops then fails at conversion with a clear message.
* GreaterOrEqual/LessOrEqual at opset ≥ 16 (version 16 only added bfloat16) are missing:
  registered as the version-12 converter.
* Flatten with ``axis=0`` (what torch.onnx writes for an Embedding's index) is wrong there: a
  correct one is registered.
* A node whose trailing optional inputs are empty names (``Clip(x, min, "")``) is read as a
  missing constant: the empty names are dropped first (the same node by the ONNX spec).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError, UnsupportedOpError

log = logging.getLogger(__name__)

#: What ``pip`` installs (without dependencies: its torchvision requirement is for two ops).
PACKAGE = "onnx2torch==1.5.15"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}"
#: Set to 0 to leave this route out (onnx2tf only), e.g. to compare the two.
ENV_VAR = "EDGESDK_ONNX2TORCH"


def missing_reason() -> str | None:
    """None when onnx2torch is importable; otherwise the one-line reason with how to install it."""
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return f"the light ONNX→TFLite route (onnx2torch) is switched off ({ENV_VAR}=0)"
    if importlib.util.find_spec("onnx2torch") is None:
        return f"the light ONNX→TFLite route needs onnx2torch: {INSTALL_HINT}"
    return None


def _torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - absent, or a CUDA build that fails to load its ops
        log.debug("torchvision does not import (%s): onnx2torch gets a stand-in", exc)
        sys.modules.pop("torchvision", None)
        sys.modules.pop("torchvision.ops", None)
        return False
    return True


@contextmanager
def _torchvision_stand_in() -> Iterator[None]:
    """A ``torchvision`` whose ops raise, in ``sys.modules`` only while onnx2torch imports."""
    if "onnx2torch" in sys.modules or _torchvision_importable():
        yield
        return

    def missing(*_args: Any, **_kwargs: Any) -> Any:
        raise UnsupportedOpError(
            "this graph needs torchvision's NonMaxSuppression/RoiAlign, and torchvision does not import here"
        )

    ops = types.ModuleType("torchvision.ops")
    ops.nms = ops.roi_align = ops.box_convert = missing  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.ops = ops  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = package, ops
    try:
        yield
    finally:
        sys.modules.pop("torchvision", None)
        sys.modules.pop("torchvision.ops", None)


def _onnx2torch() -> Any:
    """``onnx2torch.convert``, with the converters this module adds registered once."""
    with _torchvision_stand_in():
        import onnx2torch
        from onnx2torch.node_converters import registry
    _register_fixes(registry)
    return onnx2torch.convert


def _register_fixes(registry: Any) -> None:
    import torch
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    table = registry._CONVERTER_REGISTRY  # noqa: SLF001 - onnx2torch has no public way to replace one
    key = registry.OperationDescription
    for op in ("GreaterOrEqual", "LessOrEqual"):
        older = table.get(key(domain="", operation_type=op, version=12))
        for version in _since_versions(op) - {12}:
            if older is not None and version > 12:
                table.setdefault(key(domain="", operation_type=op, version=version), older)

    class Flatten(torch.nn.Module):
        """ONNX Flatten: ``[prod(dims[:axis]), prod(dims[axis:])]``, ``axis=0`` included."""

        def __init__(self, axis: int) -> None:
            super().__init__()
            self.axis = axis

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            axis = self.axis if self.axis >= 0 else x.dim() + self.axis
            return x.reshape(torch.Size(x.shape[:axis]).numel(), -1)

    def flatten(node: Any, graph: Any) -> Any:
        return OperationConverterResult(Flatten(node.attributes.get("axis", 1)), onnx_mapping_from_node(node))

    for version in _since_versions("Flatten"):
        table[key(domain="", operation_type="Flatten", version=version)] = flatten


def _since_versions(op: str) -> set[int]:
    import onnx

    return {s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain == ""}


def _without_empty_trailing_inputs(model: Any) -> Any:
    for node in model.graph.node:
        while len(node.input) and node.input[-1] == "":
            node.input.pop()
    return model


def onnx_to_torch(onnx_path: Path, *, where: str) -> Any:
    """The ONNX model as an eval-mode ``torch.nn.Module`` (a torch.fx GraphModule), its
    positional inputs in the graph's input order; UnsupportedOpError for an op it cannot map."""
    import onnx

    try:
        model = _without_empty_trailing_inputs(onnx.load(str(onnx_path)))
        convert = _onnx2torch()
    except (OSError, ValueError) as exc:  # an unreadable file was refused earlier; kept one line
        raise ConversionError(f"onnx2torch could not read {where}: {exc}") from exc
    try:
        return convert(model).eval()
    except NotImplementedError as exc:  # onnx2torch's "Converter is not implemented (...)"
        raise UnsupportedOpError(f"onnx2torch cannot map an op of {where}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - onnx2torch raises many types on graphs it misreads
        raise ConversionError(f"onnx2torch could not convert {where}: {type(exc).__name__}: {exc}") from exc
