"""An inference plan: what one (model, encoding, body layout) needs worked out once, for any transport.

The decoder of bodies of that layout into the model's feeds (with every check the generic
decoding does: names, dtypes, shapes, NaN/Inf, the memory charged), the encoder of outputs into
the answer's body and fields, the bytes a request must hold of the memory budget, the input a
batch may stack on, and the served model it was made for (held weakly: a swapped-out model is
never kept alive by a plan; a plan of a model no longer serving is never used). Worked out by
:func:`plan_for` and cached on that :class:`~edgesdk.agent.serving.ServedModel` (``plans``), so
a swap drops them all.

The HTTP server's prepared route (``prepared.py``) answers a known header block with its plan;
its decoders and encoders are the codec's (``codec.py``) written out for one layout, so the
answers are the generic path's byte for byte (tests/unit/test_agent_api_prepared.py).
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
from edgesdk.agent.api.answer import dumps
from edgesdk.agent.api.budget import Allowance
from edgesdk.agent.api.codec import (
    JSON,
    JSON_BODY,
    JSON_VALUE_BYTES,
    NPY,
    RAW,
    DecodeError,
    decode_json,
    decode_npy,
    encode_response,
    float_feed,
    json_parse_cost,
    only_key_strings,
    tensor_entries,
)
from edgesdk.agent.batching import has_batch_axis
from edgesdk.agent.nonfinite import all_finite
from edgesdk.agent.serving import ServedModel

from edgesdk.errors import InferenceInputError

log = logging.getLogger("edgesdk.agent.api")

#: Body → feeds, raising on anything the generic path should answer instead (the plan's
#: decoders raise InferenceInputError naming the input for what they find themselves).
Decode = Callable[[bytes, Allowance | None], dict[str, np.ndarray]]
#: (outputs, variant id) → (body, the answer's further fields as HTTP header lines, formatted
#: once per variant and layout: ``Name: value\r\n`` each).
Encode = Callable[[Mapping[str, np.ndarray], str], tuple[bytes, str]]
#: Plans remembered per served model (layouts a client sends: a handful).
_PLANS_MAX = 64


class InferencePlan:
    """One (model, encoding, body layout)'s decoder, encoder and limits (see module)."""

    __slots__ = ("model", "decode", "encode", "content_type", "hold", "allowances", "batch_input")

    def __init__(
        self,
        model: ServedModel,
        decode: Decode,
        encode: Encode,
        content_type: str,
        hold: int,
        allowances: bool,
        batch_input: str | None,
    ) -> None:
        self.model = weakref.ref(model)
        self.decode = decode
        self.encode = encode
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
    """``encode_response`` for this model, encoding and query, with the answer's header lines
    (X-Tensors, X-Model-Variant) formatted once per variant and, for raw tensors, output layout."""
    name, version = model.name, model.version
    formatted: dict[tuple[Any, ...], str] = {}  # (variant id, raw output layout) → header lines
    by_variant: dict[str, str] = {}  # variant id → its header line (JSON, .npy)
    # variant id → the JSON answer up to its outputs: what dumps writes for the document with
    # ``"outputs": null`` less ``null}``, so prefix + dumps(outputs) + "}" is dumps(document) byte
    # for byte, the three strings encoded once per variant instead of once per answer.
    json_starts: dict[str, tuple[bytes, str]] = {}

    def variant_lines(variant_id: str) -> str:
        lines = f"X-Model-Variant: {variant_id}\r\n"
        if len(by_variant) < _FORMATTED_MAX:
            by_variant[variant_id] = lines
        return lines

    def json_start(variant_id: str) -> tuple[bytes, str]:
        document = dumps({"model": name, "version": version, "variant": variant_id, "outputs": None})
        start = (document[: -len(b"null}")], variant_lines(variant_id))
        if len(json_starts) < _FORMATTED_MAX:
            json_starts[variant_id] = start
        return start

    def encode_json(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, str]:
        # encode_response(JSON, ...) written out: the same document (see json_starts).
        start, lines = json_starts.get(variant_id) or json_start(variant_id)
        return start + dumps(outputs) + b"}", lines

    def encode_npy(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, str]:
        body, _ = encode_response(NPY, outputs, model=name, version=version, variant=variant_id, query=query)
        return body, by_variant.get(variant_id) or variant_lines(variant_id)

    def encode_raw(outputs: Mapping[str, np.ndarray], variant_id: str) -> tuple[bytes, str]:
        key: tuple[Any, ...] | None = None  # several outputs: their layout is formatted each time
        if len(outputs) == 1:
            # One output as it came from the runtime (native little-endian, C order: the usual
            # case; else the generic encoding below): its bytes, and the lines of its layout.
            ((output, array),) = outputs.items()
            key = (variant_id, output, array.dtype, array.shape)
            lines = formatted.get(key)
            if lines is not None and array.flags.c_contiguous:
                return array.tobytes(), lines
            if not _plain_raw(array):
                key = None
        body, headers = encode_response(RAW, outputs, model=name, version=version, variant=variant_id, query=query)
        headers.append(("X-Model-Variant", variant_id))
        lines = "".join(f"{header}: {value}\r\n" for header, value in headers)
        if key is not None and len(formatted) < _FORMATTED_MAX:
            formatted[key] = lines
        return body, lines

    return {JSON: encode_json, NPY: encode_npy, RAW: encode_raw}[encoding]


#: Header lines remembered per plan: variants × output layouts, a handful.
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
