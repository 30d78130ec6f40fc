"""The one error a pipeline step raises on raw input it cannot turn into tensors."""

from __future__ import annotations

from edgesdk.errors import EdgeSDKError


class PipelineInputError(EdgeSDKError):
    """The raw input (or a model output) cannot go through the bundle's pipeline.

    ``status`` is the HTTP answer the agent's ``/predict`` gives for it: 400 corrupt input,
    413 over a declared size, 415 a media type the pipeline does not take, 422 valid but
    unusable (an image smaller than the crop), 500 a model output the post step cannot read,
    501 a decoder this install lacks. The host's conversion reads the same message.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
