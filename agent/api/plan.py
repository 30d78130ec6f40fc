"""An inference plan: what one (model, encoding, head shape) needs worked out once, for any transport.

The decoder of bodies of that shape into the model's feeds (with every check the generic
decoding does: names, dtypes, shapes, NaN/Inf, the memory charged), the encoder of outputs into
the answer's body and :class:`~edgesdk.agent.api.answer.AnswerFields` (no transport's spelling:
the HTTP adapter alone writes header lines), ``work`` (the whole inference a route hands the
scheduler: decode, ``ModelServer.infer_with_variant``, encode), the bytes a request must hold of
the memory budget, the input a batch may stack on, and the served model it was made for (held
weakly: a swapped-out model is never kept alive by a plan; a plan of a model no longer serving is
never used). Cached on that :class:`~edgesdk.agent.serving.ServedModel` (``plans``), so a swap
drops them all.

Every inference route answers through a plan:

* ``/v1/models/{name}/infer``: :func:`route_plan`, per (Content-Type, Accept, and what the
  encodings read of the head: the query for ``.npy``, X-Tensors for raw tensors), any length;
* ``/v2/.../infer`` over HTTP: ``open_inference.infer_plan``; gRPC ``ModelInfer``:
  ``grpc_codec.infer_plan`` (made with :func:`cached_plan`);
* a known header block of ``/v1`` (the HTTP server's prepared route, ``prepared.py``):
  :func:`plan_for`, per body layout and length, its decoders the codec's (``codec.py``)
  written out for one layout, so the answers are the generic route's byte for byte
  (tests/unit/test_agent_api_prepared.py).
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from math import isfinite
from typing import Any

import numpy as np
import orjson
from edgesdk.agent.api.answer import Answer, AnswerFields, dumps
from edgesdk.agent.api.budget import Allowance, unlimited_allowance
from edgesdk.agent.api.codec import (
    ENCODINGS,
    JSON,
    JSON_BODY,
    JSON_VALUE_BYTES,
    NPY,
    NPZ,
    RAW,
    DecodeError,
    UnsupportedEncodingError,
    decode_json,
    decode_npy,
    decode_request,
    encode_response,
    float_feed,
    json_parse_cost,
    only_key_strings,
    tensor_entries,
)
from edgesdk.agent.batching import has_batch_axis
from edgesdk.agent.nonfinite import all_finite
from edgesdk.agent.serving import ModelServer, ServedModel

from edgesdk.errors import InferenceInputError

log = logging.getLogger("edgesdk.agent.api")

#: Body → feeds, raising on anything the generic path should answer instead (the plan's
#: decoders raise InferenceInputError naming the input for what they find themselves).
Decode = Callable[[bytes, Allowance | None], dict[str, np.ndarray]]
#: (outputs, variant id) → (body, the answer's further fields: lasting, made once per variant
#: and output layout).
Encode = Callable[[Mapping[str, np.ndarray], str], tuple[bytes, AnswerFields]]
#: (server, the request as its transport carries it: a body, a gRPC message; its Allowance) →
#: the Answer: decode, run through ``ModelServer.infer_with_variant`` (the signature's check,
#: NaN/Inf, variant switching, the batcher, metrics), encode. Raises what refusal.py answers.
Work = Callable[[ModelServer, Any, Allowance | None], Answer]
#: Plans remembered per served model (layouts a client sends: a handful).
_PLANS_MAX = 64


class InferencePlan:
    """One (model, encoding, body layout)'s decoder, encoder and limits (see module)."""

    __slots__ = ("model", "decode", "encode", "content_type", "hold", "allowances", "batch_input", "work")

    def __init__(
        self,
        model: ServedModel,
        decode: Decode,
        encode: Encode,
        content_type: str,
        hold: int,
        allowances: bool,
        batch_input: str | None,
        work: Work | None = None,
    ) -> None:
        self.model = weakref.ref(model)
        #: Body → feeds. (A protocol whose request also says how to answer, Open Inference:
        #: the feeds; ``work`` keeps the rest.)
        self.decode = decode
        #: Outputs → the answer (Open Inference: as for a request that names no outputs).
        self.encode = encode
        #: What a route hands the scheduler: by default decode, the server's run, encode.
        self.work = work or _work(model.name, decode, encode, content_type)
        #: The answer's media type.
        self.content_type = content_type
        #: Bytes a request holds of the memory budget while it is answered: its body, and for
        #: decoders that allocate a known bound (JSON of float inputs) that bound.
        self.hold = hold
        #: Whether ``decode`` charges what it finds itself (an Allowance per request: ``.npy``,
        #: the generic JSON reading); else it is given None.
        self.allowances = allowances
        #: The input requests of this plan may be stacked on into one run (None: never batched).
        self.batch_input = batch_input


def _work(name: str, decode: Decode, encode: Encode, content_type: str) -> Work:
    """A plan's ``work`` from its decoder and encoder (the model by name: the server's check that
    it still serves, as for any request)."""

    def work(server: ModelServer, body: Any, allowance: Allowance | None) -> Answer:
        feeds = decode(body, allowance)
        outputs, variant = server.infer_with_variant(name, feeds)
        encoded, fields = encode(outputs, variant)
        answer = Answer(encoded, content_type, fields=fields)
        if server.taps:
            answer.served = (name, feeds, outputs, variant)
        return answer

    return work


def cached_plan(
    model: ServedModel, key: tuple[Any, ...], make: Callable[..., InferencePlan], *args: Any
) -> InferencePlan:
    """``model``'s plan under ``key``, made by ``make(*args)`` the first time (at most
    ``_PLANS_MAX`` kept: the head shapes are the clients' to choose; beyond them a plan is made per
    request). Callers look ``model.plans.get(key)`` up first themselves: a request's one lookup."""
    plans = model.plans
    plan = plans.get(key)
    if plan is None:
        plan = make(*args)
        if len(plans) < _PLANS_MAX:
            plans[key] = plan
    return plan


def route_plan(
    model: ServedModel, content_type: str, encoding: str, *, query: str, tensors_header: str
) -> InferencePlan:
    """The plan of ``/v1/models/{name}/infer`` for bodies in ``content_type`` answered in
    ``encoding`` (both as ``app.encodings`` reads them), of any length: the codec's decoding
    (``decode_request``: what each encoding declares checked against the signature and charged to
    the request's Allowance before anything is allocated; the server checks the rest) and this
    module's encoder, the prepared route's. The query and X-Tensors are part of its head shape only
    where an encoding reads them (``.npy``'s ``?input=`` and ``?output=``; raw tensors)."""
    if NPY not in (content_type, encoding):
        query = ""
    if content_type not in (RAW, "application/octet-stream"):
        tensors_header = ""
    key = (_ROUTE, content_type, encoding, query, tensors_header)
    return model.plans.get(key) or cached_plan(
        model, key, _make_route_plan, model, content_type, encoding, query, tensors_header
    )


#: The first item of a route plan's key (``plan_for``'s keys start with a media type).
_ROUTE = "route"


def _make_route_plan(
    model: ServedModel, content_type: str, encoding: str, query: str, tensors_header: str
) -> InferencePlan:
    signature = model.signature
    headers = {"x-tensors": tensors_header}
    decode: Decode

    if content_type in (JSON, ""):  # decode_request's choice, made once

        def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            return decode_json(body, signature, unlimited_allowance() if allowance is None else allowance)

    else:

        def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            return decode_request(content_type, body, headers, query, signature, allowance)

    # The transport holds the body; the decoder charges what it allocates to each request's Allowance.
    return InferencePlan(model, decode, _encoder(model, encoding, query), encoding, 0, True, None)


def plan_for(
    model: ServedModel,
    content_type: str,
    encoding: str,
    *,
    query: str,
    tensors_header: str,
    length: int,
    max_decoded: int,
    batch_max: int,
) -> InferencePlan | None:
    """The plan for bodies of ``length`` bytes in ``content_type`` (raw tensors laid out as
    ``tensors_header``), answered in ``encoding``, or None when that layout has none (an
    encoding without one, raw tensors that are not exactly the model's inputs). Cached on
    ``model``."""
    key = (content_type, encoding, query, tensors_header, length, max_decoded, batch_max)
    plans = model.plans
    if key in plans:
        return plans[key]
    plan = _make_plan(model, content_type, encoding, query, tensors_header, length, max_decoded, batch_max)
    if len(plans) < _PLANS_MAX:  # bounded: the layouts are the clients' to choose
        plans[key] = plan
    return plan


def _make_plan(
    model: ServedModel,
    content_type: str,
    encoding: str,
    query: str,
    tensors_header: str,
    length: int,
    max_decoded: int,
    batch_max: int,
) -> InferencePlan | None:
    if encoding not in (RAW, JSON, NPY):
        return None
    signature = model.signature
    decode: Decode
    hold, allowances = length, False  # the body; decoders that allocate say more below
    if content_type in (RAW, "application/octet-stream"):
        raw = _raw_decoder(model, tensors_header, length)
        if raw is None:
            return None
        decode = raw  # views of the body: nothing more to hold
    elif content_type in (JSON, ""):
        decode, bound = _json_decoder(model, length, max_decoded)
        if bound is None:
            allowances = True  # it charges what each body needs
        else:
            hold += bound
    elif content_type == NPY:
        allowances = True

        def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            feeds = decode_npy(body, query, signature, allowance)  # type: ignore[arg-type]  # allowances=True
            signature.check(feeds)
            return feeds

    else:
        return None
    encode = _encoder(model, encoding, query)
    return InferencePlan(model, decode, encode, encoding, hold, allowances, _batch_input(model, batch_max))


def _batch_input(model: ServedModel, batch_max: int) -> str | None:
    """The input a plan may batch on (``PreparedInfer.later``): the model's one input, when the API
    allows batches and every input and output has a dynamic first axis and, the input, fixed
    others (so that requests of one header block stack whatever their batch sizes)."""
    signature = model.signature
    if batch_max < 2 or len(signature.inputs) != 1:
        return None
    shape = signature.inputs[0].shape
    if not has_batch_axis([s.shape for s in signature.inputs], [s.shape for s in signature.outputs]):
        return None
    if not all(type(dim) is int for dim in shape[1:]):
        return None
    return signature.inputs[0].name


def _encoder(model: ServedModel, encoding: str, query: str) -> Encode:
    """``encode_response`` for this model, encoding and query, with the answer's fields made once
    per variant and, for raw tensors, output layout (lasting: see ``AnswerFields``)."""
    name, version = model.name, model.version
    layouts: dict[tuple[Any, ...], AnswerFields] = {}  # (variant id, raw output layout) → fields
    by_variant: dict[str, AnswerFields] = {}  # variant id → its fields (JSON, .npy, .npz)
    # variant id → the JSON answer up to its outputs: what dumps writes for the document with
    # ``"outputs": null`` less ``null}``, so prefix + dumps(outputs) + "}" is dumps(document) byte
    # for byte, the three strings encoded once per variant instead of once per answer.
    json_starts: dict[str, tuple[bytes, AnswerFields]] = {}

    def variant_fields(variant_id: str) -> AnswerFields:
        fields = AnswerFields(variant_id, lasting=len(by_variant) < _FORMATTED_MAX)
        if fields.lasting:
            by_variant[variant_id] = fields
        return fields

    def json_start(variant_id: str) -> tuple[bytes, AnswerFields]:
        document = dumps({"model": name, "version": version, "variant": variant_id, "outputs": None})
        start = (document[: -len(b"null}")], by_variant.get(variant_id) or variant_fields(variant_id))
        if len(json_starts) < _FORMATTED_MAX:
            json_starts[variant_id] = start
        return start

    def encode_json(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, AnswerFields]:
        # encode_response(JSON, ...) written out: the same document (see json_starts).
        start, fields = json_starts.get(variant_id) or json_start(variant_id)
        return start + dumps(outputs) + b"}", fields

    def encode_file(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, AnswerFields]:
        body, _ = encode_response(encoding, outputs, model=name, version=version, variant=variant_id, query=query)
        return body, by_variant.get(variant_id) or variant_fields(variant_id)

    def encode_raw(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, AnswerFields]:
        key: tuple[Any, ...] | None = None  # several outputs: their layout is described each time
        if len(outputs) == 1:
            # One output as it came from the runtime (native little-endian, C order: the usual
            # case; else the generic encoding below): its bytes, and the fields of its layout.
            ((output, array),) = outputs.items()
            key = (variant_id, output, array.dtype, array.shape)
            fields = layouts.get(key)
            if fields is not None and array.flags.c_contiguous:
                return array.tobytes(), fields
            if not _plain_raw(array):
                key = None
        body, tensors = encode_response(RAW, outputs, model=name, version=version, variant=variant_id, query=query)
        lasting = key is not None and len(layouts) < _FORMATTED_MAX
        fields = AnswerFields(variant_id, tensors=tensors, lasting=lasting)
        if lasting:
            layouts[key] = fields  # type: ignore[index]  # lasting: key is not None
        return body, fields

    def encode_none(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, AnswerFields]:
        # A body the API does not speak is answered in its own type, never decoded: its 415 comes first.
        raise UnsupportedEncodingError(f"cannot answer in {encoding!r}; available: {', '.join(ENCODINGS)}", 406)

    return {JSON: encode_json, NPY: encode_file, NPZ: encode_file, RAW: encode_raw}.get(encoding, encode_none)


#: Answer fields remembered per plan: variants × output layouts, a handful.
_FORMATTED_MAX = 64
#: Input shapes remembered per plan as having passed the signature's check (batch sizes).
_SHAPES_MAX = 64
_LITTLE_HOST = sys.byteorder == "little"


def _plain_raw(array: np.ndarray) -> bool:
    """True when ``array``'s bytes are its raw encoding as they are (little-endian, C order)."""
    return _LITTLE_HOST and array.dtype.isnative and array.flags.c_contiguous


def _raw_decoder(model: ServedModel, header: str, length: int) -> Decode | None:
    """The decoder of raw-tensor bodies of ``length`` bytes laid out as ``header`` says, when
    that is exactly the model's inputs in their dtypes and accepted shapes (then only the
    values can be wrong: the NaN/Inf scan is all that is left per request)."""
    signature = model.signature
    try:
        entries = tensor_entries(header)
    except DecodeError as exc:  # the generic path answers such requests
        log.debug("no prepared route for X-Tensors %r: %s", header, exc)
        return None
    layout: list[tuple[str, Any, tuple[int, ...], int, int, bool]] = []
    offset = 0
    for entry in entries:
        if not entry.dtype.isnative:
            return None  # a big-endian host swaps bytes per request: the generic path does
        scan = entry.dtype.kind == "f" and not signature.allow_nonfinite
        layout.append((entry.name, entry.dtype, entry.shape, entry.elements, offset, scan))
        offset += entry.elements * entry.dtype.itemsize
    if offset != length:
        return None
    try:
        # The signature's whole check (names, dtypes, shapes) on arrays of this layout, once:
        # of sizes the body's (just checked), which the generic path has just accepted.
        signature.check({n: np.zeros(s, d) for n, d, s, _, _, _ in layout})
    except InferenceInputError as exc:
        log.debug("no prepared route for X-Tensors %r: %s", header, exc)
        return None
    if len(layout) == 1:
        ((name, dtype, shape, _, _, scan),) = layout
        frombuffer, vdot = np.frombuffer, np.vdot

        def decode_one(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            array = frombuffer(body, dtype).reshape(shape)  # the body is the array: its length is the block's
            # all_finite's first test written out (a call saved): x·x is finite when every
            # element is (NaN/Inf propagate, squares cannot cancel); when it is not (NaN, Inf,
            # or an overflow of huge finite values) all_finite decides exactly.
            if scan and not isfinite(vdot(array, array)) and not all_finite(array):
                raise InferenceInputError(name)
            return {name: array}

        return decode_one

    def decode_many(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
        feeds = {}
        for name, dtype, shape, count, at, scan in layout:
            array = np.frombuffer(body, dtype, count, at).reshape(shape)
            if scan and not all_finite(array):
                raise InferenceInputError(name)
            feeds[name] = array
        return feeds

    return decode_many


def _json_decoder(model: ServedModel, length: int, max_decoded: int) -> tuple[Decode, int | None]:
    """The decoder of JSON bodies for this model, and the bound of what it allocates for one
    body of ``length`` bytes (None: it charges each body's own needs to the request's
    Allowance). ``codec.decode_json`` then the signature's check, written out for float inputs
    (the usual case): the same arrays and checks, in fewer calls. Anything else (a NaN or
    Infinity, which only the generic path's second parser reads; a null; an unknown or missing
    name; strings) is raised to the generic path."""
    signature = model.signature
    if signature.allow_nonfinite or any(slot.dtype.kind != "f" for slot in signature.inputs):

        def decode_generic(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            feeds = decode_json(body, signature, allowance)  # type: ignore[arg-type]  # bound None
            signature.check(feeds)
            return feeds

        return decode_generic, None
    # (name, dtype, the shapes that passed the signature's check)
    slots: list[tuple[str, np.dtype[Any], set[tuple[int, ...]]]] = [
        (slot.name, slot.dtype, set()) for slot in signature.inputs
    ]
    count = len(slots)
    # decode_json charges JSON_VALUE_BYTES per value the body may hold (commas + 1) for the
    # document, then itemsize + 8 per value of each input. A body of ``length`` bytes holds at
    # most (length + 1) // 2 values (a digit and a comma each): holding that bound, known once
    # per header block, is never less than decode_json's charge and saves counting the commas
    # of each body. (For the inline bodies plans take, 64 KiB at most, the bound is ~1.7 MB,
    # held for the microseconds of the answer.)
    # Where that bound is over the request's cap (a small api.max_decoded_bytes), every request
    # would be refused and decoded again by the generic path: the values are counted then.
    per_value = JSON_VALUE_BYTES + max(slot.dtype.itemsize for slot in signature.inputs) + 8
    bound = (length + 1) // 2 * per_value
    keys = 1 + count  # "inputs" and each input's name: the body's only strings (only_key_strings)
    loads = orjson.loads
    json_document = "a document other than the model's inputs as numbers"

    if count == 1:  # the usual case: decode below for one input, written out (two calls fewer)
        ((name, dtype, passed),) = slots
        asarray, vdot = np.asarray, np.vdot

        def decode_one(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            if allowance is not None:
                allowance.take_decoded(json_parse_cost(body) // JSON_VALUE_BYTES * per_value, JSON_BODY)
            # Two strings in the body, no more (only_key_strings): then if
            # ``document["inputs"][name]`` is there, those are the two strings and the document
            # holds nothing else (any other key is a string), so decode's checks of the
            # document's type and sizes hold. Where it is not there (another name, a list, a
            # number: KeyError, TypeError), or numpy cannot read the value as float (ragged
            # lists, an object: ValueError, TypeError), the generic path answers, as for decode.
            if not only_key_strings(body, 2):
                raise InferenceInputError(json_document)
            feed = asarray(loads(body)["inputs"][name], dtype)
            # float_feed's test: x·x is finite when every element is (else all_finite decides).
            if not isfinite(vdot(feed, feed)) and not all_finite(feed):
                raise InferenceInputError(name)
            if feed.shape not in passed:  # not seen yet: the whole check, then remembered
                signature.check({name: feed})
                if len(passed) < _SHAPES_MAX:
                    passed.add(feed.shape)
            return {name: feed}

        return decode_one, (bound if bound <= max_decoded else None)

    def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
        if allowance is not None:  # no bound held for it: what decode_json charges
            allowance.take_decoded(json_parse_cost(body) // JSON_VALUE_BYTES * per_value, JSON_BODY)
        document = loads(body)
        inputs = document["inputs"]
        if type(inputs) is not dict or len(inputs) != count or len(document) != 1 or not only_key_strings(body, keys):
            raise InferenceInputError(json_document)
        feeds = {}
        checked = True
        for name, dtype, passed in slots:
            # Numbers only: read straight into the input's dtype, as decode_json reads them;
            # None for what it leaves to the general reading (a null, an overflow to Inf,
            # ragged lists, NaN), which the generic path answers as it always has.
            feed = float_feed(inputs[name], dtype)
            if feed is None:
                raise InferenceInputError(name)
            if feed.shape not in passed:
                checked = False
            feeds[name] = feed
        if not checked:  # a shape not seen yet: the whole check (NaN/Inf included), then remembered
            signature.check(feeds)
            for name, _, passed in slots:
                if len(passed) < _SHAPES_MAX:
                    passed.add(feeds[name].shape)
        return feeds

    return decode, (bound if bound <= max_decoded else None)
