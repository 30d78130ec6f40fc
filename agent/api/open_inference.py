"""The Open Inference Protocol (KServe v2, the REST API Triton speaks), beside ``/v1``.

Routes (``{version}`` parts are optional; the one version served is the bundle's version):

=========================================================  ===================================
``GET /v2``                                                server metadata (name, version,
                                                           extensions)
``GET /v2/health/live`` / ``/v2/health/ready``             200, or 503 when no model is loaded
``GET /v2/models/{name}[/versions/{v}]``                   model metadata: datatypes (FP32,
                                                           INT64, ...) and shapes (-1: dynamic)
``GET /v2/models/{name}[/versions/{v}]/ready``             200 when that model serves
``POST /v2/models/{name}[/versions/{v}]/infer``            inference
=========================================================  ===================================

Tensors travel as JSON (``{"name", "shape", "datatype", "data"}``, data row-major, flat or
nested) or, with the binary tensor data extension, as raw little-endian bytes after the JSON
header: the request says how long the header is (``Inference-Header-Content-Length``), each
binary input carries ``parameters.binary_data_size``, and outputs come back binary when the
request asks (``outputs[].parameters.binary_data``, or ``parameters.binary_data_output`` for
all of them) — so ``tritonclient.http`` works unchanged, binary or not.

This module only translates: a request becomes the same feeds ``/v1`` decodes to and goes,
as the model's plan for its head shape (``infer_plan``, agent/api/plan.py), through the same
scheduler (admission control, inline or pool, the deadline), signature and NaN/Inf checks,
variant switching and metrics (``ModelServer.infer_with_variant``). Errors are ``{"error": "..."}``
with ``/v1``'s status codes: 400 a malformed request, 404 an unknown model or version, 422
tensors that do not fit the model (datatype, shape, NaN/Inf, unknown names), 503 no model.

Not supported (answered 400 with the reason): BYTES and BF16 tensors (no model the agent
serves takes them), the classification extension, compressed bodies (``Content-Encoding``),
shared-memory regions, the model repository and statistics extensions (404).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgesdk.agent.api.answer import Answer, AnswerFields, dumps
from edgesdk.agent.api.budget import Allowance, unlimited_allowance
from edgesdk.agent.api.codec import (
    JSON,
    DeclaredInputError,
    DecodedValueError,
    DecodeError,
    check_declared,
    json_parse_cost,
    json_shape,
    parse_json,
)
from edgesdk.agent.api.plan import InferencePlan, cached_plan
from edgesdk.agent.serving import ModelNotFoundError, ModelServer, ServedModel
from edgesdk.agent.tensor_signature import Signature, TensorSlot

from edgesdk._version import __version__

MODELS_PREFIX = "/v2/models/"
#: Lower-case, as the HTTP server stores header names.
HEADER_LENGTH = "inference-header-content-length"
BINARY_TYPE = "application/octet-stream"
EXTENSIONS = ("binary_tensor_data",)

#: Protocol datatype → numpy dtype; None: a protocol type no served model can take.
DATATYPES: dict[str, np.dtype[Any] | None] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": None,
    "BF16": None,
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items() if dtype is not None}


def datatype_name(dtype: np.dtype[Any]) -> str:
    """numpy dtype → protocol datatype (``float32`` → ``FP32``)."""
    try:
        return _NAMES[np.dtype(dtype).newbyteorder("=")]
    except KeyError:
        raise DeclaredInputError(f"dtype {np.dtype(dtype).name} has no Open Inference Protocol datatype") from None


@dataclass(frozen=True)
class ModelRoute:
    """A ``/v2/models/...`` path: what is asked (metadata, ready, infer) of which model/version."""

    action: str  # "metadata" | "ready" | "infer"
    model: str
    version: str | None


_ACTIONS = {"ready", "infer"}


def parse_model_route(path: str) -> ModelRoute | None:
    """``/v2/models/{name}[/versions/{v}][/ready|/infer]`` → ModelRoute; None for anything else."""
    if not path.startswith(MODELS_PREFIX):
        return None
    parts = path[len(MODELS_PREFIX) :].split("/")
    action = "metadata"
    if len(parts) in (2, 4) and parts[-1] in _ACTIONS:
        action = parts.pop()
    if len(parts) == 1 and parts[0]:
        return ModelRoute(action, parts[0], None)
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return ModelRoute(action, parts[0], parts[2])
    return None


def served_model(server: ModelServer, route: ModelRoute) -> ServedModel:
    """The model a route names (ModelNotFoundError for another name or version; NoModelError)."""
    model = server.get_model(route.model)
    if route.version is not None and route.version != model.version:
        raise ModelNotFoundError(f"model {route.model!r} has no version {route.version!r}; served: [{model.version!r}]")
    return model


# -- metadata ---------------------------------------------------------------------------------


def server_metadata() -> dict[str, Any]:
    return {"name": "edgesdk-agent", "version": __version__, "extensions": list(EXTENSIONS)}


def _tensor_metadata(slot: TensorSlot) -> dict[str, Any]:
    # Named or unknown dimensions (the batch axis, a sequence length) are "-1": any size.
    shape = [dim if isinstance(dim, int) else -1 for dim in slot.shape]
    return {"name": slot.name, "datatype": datatype_name(slot.dtype), "shape": shape}


def model_metadata(model: ServedModel) -> dict[str, Any]:
    """``$metadata_model_response``: platform is the active variant's runtime and format."""
    active = model.active
    fmt = str(getattr(active.meta.format, "value", active.meta.format))
    return {
        "name": model.name,
        "versions": [model.version],
        "platform": f"{active.runtime}_{fmt}",
        "inputs": [_tensor_metadata(slot) for slot in model.signature.inputs],
        "outputs": [_tensor_metadata(slot) for slot in model.signature.outputs],
    }


# -- inference requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """A decoded ``$inference_request``: feeds by input name, and how to answer."""

    feeds: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...] | None  # None: every output
    binary_output: bool  # the default for outputs that do not say
    id: str | None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(item: Mapping[str, Any], what: str) -> dict[str, Any]:
    return _object(item.get("parameters") or {}, f"{what}: parameters")


def _split_body(body: bytes, headers: Mapping[str, str]) -> tuple[bytes, memoryview]:
    """(JSON header, binary section) of a request body."""
    if headers.get("content-encoding", "identity").strip().lower() not in ("identity", ""):
        raise DecodeError(
            f"Content-Encoding {headers['content-encoding']!r} is not supported; send the body uncompressed"
        )
    raw_length = headers.get(HEADER_LENGTH)
    if raw_length is None:
        return body, memoryview(b"")
    if not raw_length.strip().isdigit() or int(raw_length) > len(body):
        raise DecodeError(
            f"Inference-Header-Content-Length {raw_length!r} must be a byte count within the {len(body)}-byte body"
        )
    length = int(raw_length)
    return body[:length], memoryview(body)[length:]


def decode_infer_request(
    body: bytes, headers: Mapping[str, str], signature: Signature, allowance: Allowance | None = None
) -> InferRequest:
    """A v2 request body (JSON, or JSON + binary tensors) → feeds for ``signature``'s inputs.

    Checks what the protocol itself defines (datatypes, element counts, binary sizes) and that
    each tensor's datatype is the input's; each declared shape is checked against the input's
    (rank, fixed dimensions) and JSON data charged to ``allowance`` before numpy builds it, as
    for ``/v1``; missing inputs and NaN/Inf are left to the server's signature check.
    """
    if allowance is None:
        allowance = unlimited_allowance()
    header, binary = _split_body(body, headers)
    parse_cost = json_parse_cost(header)
    allowance.take_decoded(parse_cost, "the JSON of the request (use the binary tensor extension for large inputs)")
    document = _object(parse_json(header), "the request")
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise DecodeError('the request needs "inputs": [{"name", "shape", "datatype", "data"}, ...]')
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise DecodeError(f'"id" must be a string, got {type(request_id).__name__}')
    parameters = _parameters(document, "the request")

    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for index, item in enumerate(inputs):
        item = _object(item, f"inputs[{index}]")
        name, dtype, shape = input_header(item.get("name"), item.get("datatype"), item.get("shape"), index, signature)
        if name in feeds:
            raise DecodeError(f"input {name!r} is given twice")
        size = _parameters(item, f"input {name!r}").get("binary_data_size")
        if size is None:
            if "data" not in item:
                raise DecodeError(f"input {name!r} has neither data nor parameters.binary_data_size")
            data = item["data"]
            feeds[name] = tensor_from_values(name, data, math.prod(json_shape(data, name)), dtype, shape, allowance)
            continue
        if "data" in item:
            raise DecodeError(f"input {name!r} has both data and parameters.binary_data_size; send one")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DecodeError(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
        needed = math.prod(shape) * dtype.itemsize
        if size != needed:
            raise DecodeError(
                f"input {name!r}: binary_data_size {size} does not match shape {list(shape)} of "
                f"{datatype_name(dtype)} ({needed} bytes)"
            )
        if offset + size > len(binary):
            raise DecodeError(
                f"input {name!r}: the binary section has {len(binary)} bytes; this input needs bytes {offset}..{offset + size}"
            )
        feeds[name] = tensor_from_bytes(name, binary[offset : offset + size], dtype, shape)
        offset += size
    if offset != len(binary):
        raise DecodeError(
            f"the binary section has {len(binary)} bytes; the inputs' binary_data_size add up to {offset}"
        )
    allowance.give_back(parse_cost)  # the parsed document is garbage once the arrays exist (as /v1)
    return InferRequest(
        feeds=feeds,
        outputs=_requested_outputs(document.get("outputs"), signature),
        binary_output=_flag(parameters, "binary_data_output", "the request"),
        id=request_id,
    )


def input_header(
    name: Any, datatype: Any, shape: Any, index: int, signature: Signature
) -> tuple[str, np.dtype[Any], tuple[int, ...]]:
    """(name, dtype, shape) of one request input, whichever transport carried it (JSON, gRPC):
    its datatype checked against the model's, its shape against the input's (rank, fixed
    dimensions) before anything is built from it."""
    if not isinstance(name, str) or not name:
        raise DecodeError(f"inputs[{index}] needs a string name")
    if datatype not in DATATYPES:
        raise DecodeError(f"input {name!r}: unknown datatype {datatype!r}; known: {', '.join(DATATYPES)}")
    if not isinstance(shape, Sequence) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise DecodeError(f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}")
    slot = signature.by_name.get(name)
    if slot is None:
        raise DeclaredInputError(f"unknown input {name!r}; the model takes {list(signature.by_name)}")
    expected = datatype_name(slot.dtype)
    if datatype != expected:
        raise DeclaredInputError(f"input {name!r}: datatype {datatype}, the model takes {expected}")
    declared = tuple(shape)
    check_declared(signature, name, declared)
    return name, slot.dtype, declared


def tensor_from_values(
    name: str, values: Any, given: int, dtype: np.dtype[Any], shape: tuple[int, ...], allowance: Allowance
) -> np.ndarray:
    """An input from numbers (JSON ``data``, nested or flat; gRPC typed ``contents``): ``given``
    is how many values were sent, checked against ``shape`` and charged before numpy builds it."""
    count = math.prod(shape)
    if given != count:
        raise DecodeError(f"input {name!r}: {given} values for shape {list(shape)}, which holds {count}")
    # numpy reads the numbers as int64/float64 first, then converts: both are held at once.
    allowance.take_decoded(count * dtype.itemsize + count * 8, f"input {name!r}")
    return _json_tensor(name, values, dtype, shape)


def tensor_from_bytes(name: str, data: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """An input from its little-endian, row-major bytes (the binary extension, gRPC raw
    contents): a view of them, copied only when misaligned."""
    count = math.prod(shape)
    needed = count * dtype.itemsize
    if len(data) != needed:
        raise DecodeError(
            f"input {name!r}: {len(data)} bytes of data for shape {list(shape)} of "
            f"{datatype_name(dtype)}, which needs {needed}"
        )
    array = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=count).reshape(shape)
    array = array.astype(dtype, copy=False)  # native byte order (a no-op here)
    # After a JSON header of any length the bytes may sit at an odd address: runtimes and the
    # NaN/Inf scan want aligned arrays, so those are copied (a memcpy, only then).
    return array if array.flags.aligned else array.copy()


def _json_tensor(name: str, data: Any, dtype: np.dtype[Any], shape: Sequence[int]) -> np.ndarray:
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"input {name!r}: data is not a rectangular array of numbers ({exc})") from exc
    if raw.dtype.kind not in "biuf":
        # numpy holds integers beyond 64 bits as objects: say so rather than "not numbers".
        what = "numbers (an integer is too large, or a value is not a number)" if raw.dtype.kind == "O" else "numbers"
        raise DecodedValueError(f"input {name!r}: data must be {what}; got {raw.dtype.kind!r} data")
    count = math.prod(shape)
    if raw.size != count:
        raise DecodeError(f"input {name!r}: {raw.size} values for shape {list(shape)}, which holds {count}")
    if dtype.kind in "iu" and raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
            raise DecodedValueError(f"input {name!r}: expected integers ({datatype_name(dtype)}), got fractions")
    if dtype.kind in "iu" and raw.size and raw.dtype.kind in "iuf":
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise DecodedValueError(f"input {name!r}: values out of range for {datatype_name(dtype)}")
    if dtype.kind == "b" and raw.dtype.kind != "b":
        raise DecodedValueError(f"input {name!r}: BOOL data must be true/false")
    return raw.reshape(shape).astype(dtype, copy=False)


def _flag(parameters: Mapping[str, Any], key: str, what: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise DecodeError(f"{what}: parameters.{key} must be true or false, got {value!r}")
    return value


def _requested_outputs(value: Any, signature: Signature) -> tuple[RequestedOutput, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise DecodeError('"outputs" must be a list of {"name", "parameters"}')
    requested = []
    for index, item in enumerate(value):
        item = _object(item, f"outputs[{index}]")
        name = item.get("name")
        requested.append(requested_output(name, _parameters(item, f"output {name!r}"), index, signature))
    return tuple(requested)


def requested_output(name: Any, parameters: Mapping[str, Any], index: int, signature: Signature) -> RequestedOutput:
    """One ``outputs[]`` entry (JSON or gRPC): a known output, in binary or not."""
    if not isinstance(name, str) or not name:
        raise DecodeError(f"outputs[{index}] needs a string name")
    known = [slot.name for slot in signature.outputs]
    if name not in known:
        raise DeclaredInputError(f"unknown output {name!r}; the model has {known}")
    if parameters.get("classification"):
        raise DecodeError(f"output {name!r}: the classification extension is not supported; ask for the tensor")
    return RequestedOutput(name, _flag(parameters, "binary_data", f"output {name!r}"))


# -- inference responses ----------------------------------------------------------------------


def encode_infer_response(
    request: InferRequest, outputs: Mapping[str, np.ndarray], *, model: str, version: str, variant: str
) -> Answer:
    """``$inference_response``: JSON data, or a JSON header followed by binary outputs."""
    wanted = request.outputs or tuple(RequestedOutput(name, request.binary_output) for name in outputs)
    described: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for output in wanted:
        array = outputs[output.name]
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": datatype_name(array.dtype),
            "shape": list(array.shape),
        }
        if output.binary:
            data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = np.ascontiguousarray(array).ravel()  # orjson writes float32 as float32
        described.append(entry)
    document: dict[str, Any] = {"model_name": model, "model_version": version}
    if request.id is not None:
        document["id"] = request.id
    document["parameters"] = {"variant": variant}
    document["outputs"] = described
    header = dumps(document)
    if not chunks:
        return Answer(header, fields=_FIELDS.get((variant, None)) or _fields(variant, None))
    length = len(header)
    return Answer(
        b"".join([header, *chunks]), BINARY_TYPE, fields=_FIELDS.get((variant, length)) or _fields(variant, length)
    )


#: (variant id, JSON length) → the answer's fields, lasting: a client's requests of one shape get
#: answers of one JSON length, so a transport spells their fields once (http.field_lines).
_FIELDS: dict[tuple[str, int | None], AnswerFields] = {}
_FIELDS_MAX = 256


def _fields(variant: str, json_length: int | None) -> AnswerFields:
    lasting = len(_FIELDS) < _FIELDS_MAX
    fields = AnswerFields(variant, json_length=json_length, lasting=lasting)
    if lasting:
        _FIELDS[(variant, json_length)] = fields
    return fields


def infer_plan(model: ServedModel, headers: Mapping[str, str]) -> InferencePlan:
    """``model``'s plan for ``POST .../infer`` requests with these headers (what of them the
    decoding reads: Inference-Header-Content-Length, Content-Encoding: its head shape). Its work:
    decode (``decode_infer_request``), run through the server (all its checks), encode; raises the
    errors refusal.py answers, as ``/v1`` does."""
    length, encoding = headers.get(HEADER_LENGTH), headers.get(_ENCODING)
    key = ("v2", length, encoding)
    return model.plans.get(key) or cached_plan(model, key, _make_plan, model, _read_headers(length, encoding))


#: Content-Encoding, lower-case as the HTTP server stores header names.
_ENCODING = "content-encoding"


def _read_headers(length: str | None, encoding: str | None) -> dict[str, str]:
    """The headers a plan's decoding reads (``_split_body``), as the request had them."""
    read = {HEADER_LENGTH: length, _ENCODING: encoding}
    return {name: value for name, value in read.items() if value is not None}


#: A request that names no outputs and asks for no binary ones: what a plan's ``encode`` answers.
_PLAIN = InferRequest(feeds={}, outputs=None, binary_output=False, id=None)


def _make_plan(model: ServedModel, headers: Mapping[str, str]) -> InferencePlan:
    signature, name, version = model.signature, model.name, model.version

    def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
        return decode_infer_request(body, headers, signature, allowance).feeds

    def encode(outputs: Mapping[str, np.ndarray], variant: str) -> tuple[bytes, AnswerFields]:
        answer = encode_infer_response(_PLAIN, outputs, model=name, version=version, variant=variant)
        return answer.body, answer.fields  # type: ignore[return-value]  # always set here

    def work(server: ModelServer, body: Any, allowance: Allowance | None) -> Answer:
        infer_request = decode_infer_request(body, headers, signature, allowance)
        outputs, variant = server.infer_with_variant(name, infer_request.feeds)
        answer = encode_infer_response(infer_request, outputs, model=name, version=version, variant=variant)
        if server.taps:
            answer.served = (name, infer_request.feeds, outputs, variant)
        return answer

    # The transport holds the body; the decoder charges what it allocates to each request's Allowance.
    return InferencePlan(model, decode, encode, JSON, 0, True, None, work)


def model_ready(server: ModelServer, route: ModelRoute) -> dict[str, Any]:
    """``GET .../ready`` of a served model (ModelNotFoundError, NoModelError otherwise)."""
    return {"name": served_model(server, route).name, "ready": True}


def model_metadata_document(server: ModelServer, route: ModelRoute) -> dict[str, Any]:
    """``GET /v2/models/{name}[/versions/{v}]``."""
    return model_metadata(served_model(server, route))
