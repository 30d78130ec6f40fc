"""Open Inference Protocol messages over gRPC ↔ what ``/v2`` over HTTP decodes to.

Only translation: a ``ModelInferRequest`` becomes, through the model's plan for gRPC
(``infer_plan``, agent/api/plan.py), the same :class:`~open_inference.InferRequest` the HTTP
routes build, through the same per-input checks (``input_header``: name, datatype and
shape against the model's signature; ``tensor_from_bytes`` / ``tensor_from_values``: sizes,
integer ranges, the memory budget), then goes through the same admission control and
``ModelServer.infer_with_variant`` (signature, NaN/Inf, variant switching, metrics). What is
specific to gRPC is only where the data sits:

* ``raw_input_contents`` — one little-endian byte string per input, in the order of ``inputs``
  (what ``tritonclient.grpc`` sends); then no input may carry ``contents``;
* ``inputs[].contents`` — typed repeated values, the field matching the datatype
  (``fp32_contents`` for FP32, ``int_contents`` for INT8/16/32, ...; FP16 has none: raw only).

Outputs always come back in ``raw_output_contents`` (as Triton answers), the active variant in
the response's ``parameters["variant"]``.

Needs ``protobuf`` (the ``grpc`` extra); imported only when the gRPC endpoint is configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from edgesdk.agent.api import open_inference_v2_pb2 as pb
from edgesdk.agent.api.answer import Answer, AnswerFields
from edgesdk.agent.api.budget import Allowance, unlimited_allowance
from edgesdk.agent.api.codec import DecodeError
from edgesdk.agent.api.open_inference import (
    InferRequest,
    ModelRoute,
    datatype_name,
    input_header,
    model_metadata,
    requested_output,
    served_model,
    server_metadata,
    tensor_from_bytes,
    tensor_from_values,
)
from edgesdk.agent.api.plan import InferencePlan, cached_plan
from edgesdk.agent.serving import ModelServer, ServedModel
from edgesdk.agent.tensor_signature import Signature

#: Protocol datatype → the ``InferTensorContents`` field that carries it (FP16: raw only).
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def parameters_dict(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` → {name: bool | int | str}."""
    result: dict[str, Any] = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            result[key] = getattr(value, choice)
    return result


def decode_grpc_request(
    message: pb.ModelInferRequest, signature: Signature, allowance: Allowance | None = None
) -> InferRequest:
    """A parsed ``ModelInferRequest`` → feeds for ``signature``'s inputs (DecodeError: 400-like,
    InferenceInputError: 422-like, BudgetRefused: over a memory limit)."""
    if allowance is None:
        allowance = unlimited_allowance()
    if not message.inputs:
        raise DecodeError("the request has no inputs; send one InferInputTensor per model input")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise DecodeError(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; send one per input, in order"
        )
    feeds: dict[str, np.ndarray] = {}
    for index, item in enumerate(message.inputs):
        name, dtype, shape = input_header(item.name, item.datatype, item.shape, index, signature)
        if name in feeds:
            raise DecodeError(f"input {name!r} is given twice")
        has_contents = item.HasField("contents")
        if raw:
            if has_contents:
                raise DecodeError(f"input {name!r} has contents beside raw_input_contents; send one of them")
            feeds[name] = tensor_from_bytes(name, memoryview(raw[index]), dtype, shape)
            continue
        if not has_contents:
            raise DecodeError(f"input {name!r} has no data: set its contents or the request's raw_input_contents")
        feeds[name] = _contents_tensor(name, item.datatype, item.contents, dtype, shape, allowance)
    return InferRequest(
        feeds=feeds,
        outputs=tuple(
            requested_output(item.name, parameters_dict(item.parameters), index, signature)
            for index, item in enumerate(message.outputs)
        )
        or None,
        binary_output=True,
        id=message.id or None,
    )


def _contents_tensor(
    name: str,
    datatype: str,
    contents: pb.InferTensorContents,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    allowance: Allowance,
) -> np.ndarray:
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise DecodeError(f"input {name!r}: {datatype} has no typed contents field; send it in raw_input_contents")
    others = [descriptor.name for descriptor, _ in contents.ListFields() if descriptor.name != field]
    if others:
        raise DecodeError(f"input {name!r}: {datatype} data goes in contents.{field}, got {', '.join(others)}")
    values = getattr(contents, field)
    return tensor_from_values(name, values, len(values), dtype, shape, allowance)


def encode_grpc_response(
    request: InferRequest, outputs: Mapping[str, np.ndarray], *, model: str, version: str, variant: str
) -> bytes:
    """``ModelInferResponse`` (serialized): every output raw, little-endian, row-major."""
    names = [output.name for output in request.outputs] if request.outputs else list(outputs)
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.id or "")
    response.parameters["variant"].string_param = variant
    for name in names:
        array = outputs[name]
        response.outputs.add(name=name, datatype=datatype_name(array.dtype), shape=array.shape)
        response.raw_output_contents.append(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    return response.SerializeToString()


def answer_grpc_infer(server: ModelServer, message: pb.ModelInferRequest, allowance: Allowance | None) -> Answer:
    """``ModelInfer``'s work for the scheduler: the model's plan (``infer_plan``) on the message, the
    serialized ``ModelInferResponse`` as the answer's body; raises the errors refusal.py answers
    (with their gRPC codes)."""
    model = served_model(server, ModelRoute("infer", message.model_name, message.model_version or None))
    return infer_plan(model).work(server, message, allowance)


#: The media type of a gRPC answer's body (a serialized ``ModelInferResponse``).
GRPC_TYPE = "application/grpc"
#: A request that names no outputs: what a plan's ``encode`` answers.
_PLAIN = InferRequest(feeds={}, outputs=None, binary_output=True, id=None)


def infer_plan(model: ServedModel) -> InferencePlan:
    """``model``'s plan for ``ModelInfer`` (one head shape: the message says the rest). Its
    ``decode`` takes a parsed message; its work decodes, runs through the server (all its checks),
    encodes."""
    return model.plans.get(_KEY) or cached_plan(model, _KEY, _make_plan, model)


_KEY = ("grpc",)


def _make_plan(model: ServedModel) -> InferencePlan:
    signature, name, version = model.signature, model.name, model.version

    def decode(message: Any, allowance: Allowance | None) -> dict[str, np.ndarray]:
        return decode_grpc_request(message, signature, allowance).feeds

    def encode(outputs: Mapping[str, np.ndarray], variant: str) -> tuple[bytes, AnswerFields]:
        return encode_grpc_response(_PLAIN, outputs, model=name, version=version, variant=variant), AnswerFields(
            variant
        )

    def work(server: ModelServer, message: Any, allowance: Allowance | None) -> Answer:
        infer_request = decode_grpc_request(message, signature, allowance)
        outputs, variant = server.infer_with_variant(name, infer_request.feeds)
        body = encode_grpc_response(infer_request, outputs, model=name, version=version, variant=variant)
        answer = Answer(body, GRPC_TYPE)
        if server.taps:
            answer.served = (name, infer_request.feeds, outputs, variant)
        return answer

    # The server holds the message (twice: its bytes and its parsed form); the decoder charges
    # what it allocates to each request's Allowance.
    return InferencePlan(model, decode, encode, GRPC_TYPE, 0, True, None, work)


def model_metadata_message(model: ServedModel) -> pb.ModelMetadataResponse:
    """``ModelMetadataResponse``: the same document as ``GET /v2/models/{name}``."""
    return pb.ModelMetadataResponse(**model_metadata(model))


def server_metadata_message() -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(**server_metadata())
