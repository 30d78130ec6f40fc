"""``POST /v1/models/{name}/predict``: raw image bytes in, the task result out.

Not a route of its own to the model: the bundle's signed pipeline decodes and pre-processes
the body into the model's input, hands it to the same ``ModelServer.infer_with_variant`` the
tensor routes use (same admission control in ``ApiApp._infer``, same signature check, same
variant ladder), then post-processes the output into ``{"labels": [...]}`` or a PNG mask. The
body is decoded in memory only; its declared pixel count is checked before decoding.
"""

from __future__ import annotations

from typing import Any

from edgesdk.agent.api.budget import BudgetRefused
from edgesdk.agent.api.codec import DecodeError, media_type
from edgesdk.agent.api.http import Request, Response, json_response
from edgesdk.agent.pipeline.image import PipelineInputError, decoded_nbytes, open_image, to_tensor
from edgesdk.agent.pipeline.post import mask_png, top_classes
from edgesdk.agent.serving import ModelServer

SUFFIX = "/predict"


def answer_predict(server: ModelServer, request: Request, model_name: str) -> Response:
    """The task result for one image (an ``InferAnswer`` for ``ApiApp._infer``)."""
    try:
        return _predict(server, request, model_name)
    except PipelineInputError as exc:
        if exc.status == 400:
            raise DecodeError(str(exc)) from None
        # BudgetRefused carries any status to ApiApp._answer: 413 bomb, 415 type, 422 too small.
        raise BudgetRefused(exc.status, str(exc)) from None


def _predict(server: ModelServer, request: Request, model_name: str) -> Response:
    model = server.get_model(model_name)
    pipeline = getattr(model, "pipeline", None)
    if pipeline is None:
        raise PipelineInputError(
            404, f"model {model_name!r} has no pipeline in its bundle: send tensors to /v1/models/{model_name}/infer"
        )
    if len(model.signature.inputs) != 1:
        raise PipelineInputError(
            422, f"model {model_name!r} has {len(model.signature.inputs)} inputs; a pipeline feeds one"
        )
    image = open_image(request.body, media_type(request.headers.get("content-type")), pipeline.image.max_pixels)
    if request.allowance is not None:
        request.allowance.take_decoded(decoded_nbytes(image, pipeline.image), "the decoded image")
    slot = model.signature.inputs[0]
    tensor = to_tensor(image, pipeline.image, slot.dtype)
    outputs, variant = server.infer_with_variant(model_name, {slot.name: tensor})
    post = pipeline.post
    name = post.output or model.signature.outputs[0].name
    if name not in outputs:
        raise PipelineInputError(500, f"the pipeline reads output {name!r}; the model has {sorted(outputs)}")
    headers = [("X-Model-Variant", variant)]
    if post.kind == "mask":
        return Response(200, mask_png(outputs[name], post), content_type="image/png", headers=headers)
    payload: dict[str, Any] = {
        "model": model.name,
        "version": model.version,
        "variant": variant,
        "labels": top_classes(outputs[name], post),
    }
    return json_response(200, payload, headers)
