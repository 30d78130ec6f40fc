"""The bundle pipeline's steps, shared by the device and the host (issue 42).

``preprocess`` turns raw bytes into a model's input tensors as the bundle's signed pipeline
(``edgesdk.schemas.pipeline``) declares, ``postprocess`` turns its outputs into the task
result, ``compare_results`` says how far two task results agree. The agent's ``/predict``
serves them; the host runs the same code when it validates a bundle end to end. numpy, plus
the ``pipeline`` extra's decoders (Pillow), all in memory.
"""

from __future__ import annotations

from edgesdk.pipeline.compare import compare_results
from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.pipeline.run import InputSpec, Limits, Prepared, postprocess, prepare, preprocess

__all__ = [
    "InputSpec",
    "Limits",
    "PipelineInputError",
    "Prepared",
    "compare_results",
    "postprocess",
    "prepare",
    "preprocess",
]
