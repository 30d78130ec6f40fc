"""``POST /v1/models/{name}/predict``: raw bytes in, the task result out.

Not a route of its own to the model: the bundle's signed pipeline (``edgesdk.pipeline``, the
same steps the host validates with) decodes and pre-processes the body into the model's
inputs, hands them to the same ``ModelServer.infer_with_variant`` the tensor routes use (same
admission control in ``ApiApp._infer``, same signature check, same variant ladder), then
post-processes the outputs into the task result (JSON, or a PNG mask; a detector's boxes in
the sent image's pixels, edgesdk/pipeline/geometry.py). The body is decoded in memory only;
declared sizes are checked before decoding.
"""

from __future__ import annotations

from typing import Any

from edgesdk.agent.api.answer import Answer, json_answer
from edgesdk.agent.api.budget import BudgetRefused
from edgesdk.agent.api.codec import DecodeError, media_type
from edgesdk.agent.api.http import Request
from edgesdk.agent.serving import ModelServer

from edgesdk.pipeline import Limits, PipelineInputError, postprocess, prepare
from edgesdk.pipeline.post import png_of
from edgesdk.pipeline.streaming import split_calls, stack_calls

SUFFIX = "/predict"


def answer_predict(server: ModelServer, request: Request, model_name: str) -> Answer:
    """The task result for one raw input (an ``InferAnswer`` for ``ApiApp._infer``)."""
    try:
        return _predict(server, request, model_name)
    except PipelineInputError as exc:
        if exc.status == 400:
            raise DecodeError(str(exc)) from None
        # BudgetRefused carries any status to ApiApp._answer: 413 bomb, 415 type, 422 too small.
        raise BudgetRefused(exc.status, str(exc)) from None


def _predict(server: ModelServer, request: Request, model_name: str) -> Answer:
    model = server.get_model(model_name)
    pipeline = getattr(model, "pipeline", None)
    if pipeline is None:
        raise PipelineInputError(
            404, f"model {model_name!r} has no pipeline in its bundle: send tensors to /v1/models/{model_name}/infer"
        )
    allowance = request.allowance
    limits = Limits(charge=allowance.take_decoded if allowance is not None else None)
    content_type = media_type(request.headers.get("content-type"))
    prepared = prepare(pipeline, request.body, content_type, model.signature.inputs, limits)
    feeds = prepared.feeds
    streaming = pipeline.input == "audio" and pipeline.audio.stream is not None
    if streaming:  # a streaming model: one call per chunk of features, from its initial state
        calls, variant = server.infer_stream(model_name, split_calls(feeds, model.signature.inputs[0].name))
        outputs = stack_calls(calls)
    else:
        outputs, variant = server.infer_with_variant(model_name, feeds)
    # In the public signature's order, so "the first output" means the model's first.
    ordered = {spec.name: outputs[spec.name] for spec in model.signature.outputs if spec.name in outputs}
    result = postprocess(pipeline, ordered, feeds, prepared.frame)  # boxes in the sent image's pixels
    headers = [("X-Model-Variant", variant)]
    payload: dict[str, Any] = {"model": model.name, "version": model.version, "variant": variant, **result}
    if "mask" in result:
        response = Answer(png_of(result["mask"]), "image/png", headers)
    else:
        response = json_answer(payload, headers)
    # The model's own feeds and outputs (ModelServer.taps); a stream's stacked calls are not one
    # request of the model's signature, so drift capture and shadows do not see them.
    if server.taps and not streaming:
        response.served = (model.name, feeds, outputs, variant)
    return response
