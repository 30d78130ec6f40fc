"""edgesdk.converters: the host toolchain that turns PyTorch or ONNX models into device artifacts.

Public API::

    from edgesdk.converters import convert
    report = convert(model_or_path, "rpi5-8gb", "out/", calibration="cal.npz", validation="val.npz")

Backends (``onnx``, ``tflite``, ``openvino``, ``coreml``) live one module each behind the
:class:`~edgesdk.converters.base.Converter` protocol, named in :data:`CONVERTERS` and imported
only when used; :func:`~edgesdk.converters.planner.make_plan` decides what to build.
"""

from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, Converter, SourceModel
from edgesdk.converters.pipeline import convert
from edgesdk.converters.registry import CONVERTERS, get_converter, installed_converters

__all__ = [
    "CONVERTERS",
    "ConversionRequest",
    "ConvertedArtifact",
    "Converter",
    "SourceModel",
    "convert",
    "get_converter",
    "installed_converters",
]
