"""A route prepared per known header block: a tiny model's inference without its routing.

A keep-alive client repeats one header block with every request (``http.KnownHead``): the same
path, so the same model; the same Content-Type, Accept and query, so the same encodings; for raw
tensors the same X-Tensors, so the same input names, dtypes and shapes; the same Content-Length.
The generic path (``ApiApp.handle`` → ``answer_v1``) works all of that out again for each
request (routing, the model by name, both encodings, the tensor header, the declared shapes
against the signature): ~25 Python calls, more than a tiny model's run (BENCHMARKS.md, issue 15).

Once the generic path has answered a request of such a block 200 on the event loop (a tiny
model, see ``inline_max_ms``), the app prepares a :class:`PreparedInfer` for the block with all
of that resolved. Each later request of the block then does only what depends on its body and
on the moment: admission (capacity, the inline decision, its share of the memory budget), the
body as arrays, the checks that depend on the values (NaN/Inf; for JSON and ``.npy``, whose
shapes are in the body, the whole signature check), the active variant's run, the latency
histogram, the answer. The plan is the block's ``http.InlineRoute``: the HTTP server asks it
before making a Request, so an answered request never has a Request, an Allowance, a
``respond`` callback or a Response (each costs on every answer of a tiny model).

It never answers an error itself. Anything it does not expect (the model swapped, the inline
conditions not met, capacity or the memory budget full, a body that does not decode, NaN/Inf,
a runtime failure) is declined, all it held given back first, and the HTTP server hands the
request to the generic path, which answers it as it always did: same status code, same error
count. So the API behaves as the generic path by construction; the plan only makes the plain
case shorter. (A runtime failure runs the model twice, once here and once to be answered: rare,
and the price of keeping one error path.)
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from math import isfinite
from time import perf_counter
from typing import TYPE_CHECKING, Any

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
from edgesdk.agent.api.http import KnownHead, Request, head_start
from edgesdk.agent.batching import has_batch_axis
from edgesdk.agent.nonfinite import all_finite
from edgesdk.agent.serving import ServedModel

from edgesdk.errors import InferenceInputError

if TYPE_CHECKING:
    from edgesdk.agent.api.app import ApiApp

log = logging.getLogger("edgesdk.agent.api")

#: Body → feeds, raising on anything the generic path should answer instead (the plan's
#: decoders raise InferenceInputError naming the input for what they find themselves).
Decode = Callable[[bytes, Allowance | None], dict[str, np.ndarray]]
#: (outputs, variant id) → (body, the answer's header lines, formatted: ``Response.head_lines``).
Encode = Callable[[Mapping[str, np.ndarray], str], tuple[bytes, str]]


class PreparedInfer:
    """``POST /v1/models/{name}/infer`` for every request with one header block (see module):
    the block's ``http.InlineRoute``, which the HTTP server asks before it makes a Request."""

    __slots__ = (
        "scheduler",
        "server",
        "model",
        "known",
        "decode",
        "encode",
        "head",
        "budget",
        "max_decoded",
        "hold",
        "allowances",
        "_variant",
        "_ran",
        "_allowance",
        "batching",
        "batch_max",
        "_input",
        "_pending",
        "_company",
        "_probe_left",
        "_probes",
        "_served",
    )

    def __init__(
        self,
        app: ApiApp,
        model: ServedModel,
        known: KnownHead,
        decode: Decode,
        encode: Encode,
        encoding: str,
        limits: Allowance,
        hold: int,
        allowances: bool,
        batch_input: str | None = None,
    ) -> None:
        self.scheduler = app.scheduler
        self.server = app.server
        # Weakly: a block nobody sends again keeps its plan, and an update's previous model
        # (its runtime sessions, tens of MB) must not stay in memory for it.
        self.model = weakref.ref(model)
        self.known = known
        self.decode = decode
        self.encode = encode
        self.head = head_start(200, encoding)
        # The HTTP server's memory budget and per-request cap (those of the request it was
        # prepared from): a request it answers holds its share of that budget itself.
        self.budget = limits.budget
        self.max_decoded = limits.max_decoded
        #: Bytes held of the server's memory budget while a request is answered: its body, and
        #: for decoders that allocate a known bound (JSON of float inputs) that bound.
        self.hold = hold
        #: Whether ``decode`` charges what it finds itself (an Allowance per request: ``.npy``,
        #: the generic JSON reading); else it is given None.
        self.allowances = allowances
        # The request being answered, from ``answer`` to ``answered`` (one at a time: both run
        # on the event loop, back to back, around the HTTP server's write).
        self._variant = ""
        self._ran = 0.0
        self._allowance: Allowance | None = None
        # Batches of the requests one wake-up of the loop brings (``later``): the model's one
        # input, when it has a batch axis and the API allows batches (inline_batch_max > 1).
        self.batching = batch_input is not None
        self.batch_max = app.scheduler.inline_batch_max
        self._input = batch_input or ""
        #: (connection, body, its input array, its Allowance) of the requests taken for the next batch.
        self._pending: list[tuple[Any, bytes, np.ndarray, Allowance | None]] = []
        self._company = 0  # requests in the last batch
        self._probe_left = _PROBE_EVERY
        self._probes = 0
        #: (model name, feeds, outputs) of the request being answered, kept only while the
        #: server has taps (``ModelServer.taps``), for ``answered`` to hand them.
        self._served: tuple[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None

    def answer(self, body: bytes) -> tuple[bytes, str] | None:
        scheduler = self.scheduler
        model = self.model()
        # Swapped or unloaded: the generic path answers, and prepares again for what serves now.
        if model is None or self.server.model is not model:
            self.known.route = None
            self.known.settled = False
            return None
        requests = scheduler.requests
        if requests.count >= scheduler.capacity or not scheduler.inline_left:
            return None  # a 503, or the pool: the generic path decides
        budget, hold = self.budget, self.hold
        with budget.lock:  # Allowance.take_body, written out (the generic path answers a 503)
            if budget.used + hold > budget.capacity:
                return None
            budget.used += hold
        allowance = Allowance(budget, self.max_decoded) if self.allowances else None
        requests.count += 1
        try:
            feeds = self.decode(body, allowance)
            variant = model.active  # taken once: this request finishes on this variant
            run = variant.loaded.run if variant.takes_public_feeds else variant.run
            started = perf_counter()
            outputs = run(feeds)
            ran = perf_counter() - started
            answer = self.encode(outputs, variant.id)
        except Exception as exc:  # noqa: BLE001 - every error is the generic path's to answer (see module)
            log.debug("prepared route: %s goes to the generic path (%r)", self.known.path, exc)
            # All back: the generic path takes its own share, within the same limits.
            self._finish(allowance)
            return None
        self._variant, self._ran, self._allowance = variant.id, ran, allowance
        if self.server.taps:
            self._served = (model.name, feeds, outputs)
        return answer

    def answered(self) -> None:
        """Once the answer is on its way: what the client need not wait for."""
        allowance, self._allowance = self._allowance, None
        self._finish(allowance)
        ran = self._ran
        self.server.observe(self._variant, ran)
        # The run's time stands for the whole answer's in the inline decision: what the plan
        # adds is a few microseconds for the small bodies it takes (the generic path times both).
        self.scheduler.took(ran)
        served = self._served
        if served is not None:
            self._served = None
            self.server.tap(*served, self._variant)

    def later(self, connection: Any, body: bytes) -> bool:
        """Take this request for a batch with the others this wake-up of the loop brings (from
        other connections: each sends one request at a time), run once their reads are done
        (``_run_batch``, next on the loop), or False: ``answer`` answers it now.

        A batch runs only when it may have company: the first request of a wake-up is taken
        when the last batch had two or more, and, after a batch ran alone, every
        ``_PROBE_EVERY``-th request or so (clients come and go); else it is answered at once, as
        without batching (a lone request waiting for nobody would only lose the loop's turn).
        A request taken holds what ``answer`` would (its count, its memory share) and has been
        decoded and checked; a body that does not decode is left to ``answer``, which declines
        it as always."""
        pending = self._pending
        if not pending:
            if self._company < 2:
                self._probe_left -= 1
                if self._probe_left > 0:
                    return False
                # The period varies (16-22): a fixed one could keep landing on the last read of
                # each wake-up (a client pattern of that period), which finds no company.
                self._probes += 1
                self._probe_left = _PROBE_EVERY + self._probes % 7
        elif len(pending) >= self.batch_max:
            return False
        scheduler = self.scheduler
        model = self.model()
        if model is None or self.server.model is not model:
            return False  # answer() unsettles the block
        requests = scheduler.requests
        if requests.count >= scheduler.capacity or not scheduler.inline_left:
            return False
        budget, hold = self.budget, self.hold
        with budget.lock:
            if budget.used + hold > budget.capacity:
                return False
            budget.used += hold
        allowance = Allowance(budget, self.max_decoded) if self.allowances else None
        requests.count += 1
        try:
            feed = self.decode(body, allowance)[self._input]
        except Exception as exc:  # noqa: BLE001 - answer() meets it again and hands it to the generic path
            log.debug("prepared route: %s not taken for a batch (%r)", self.known.path, exc)
            self._finish(allowance)
            return False
        pending.append((connection, body, feed, allowance))
        if len(pending) == 1:
            connection.loop.call_soon(self._run_batch)
        return True

    def _run_batch(self) -> None:
        """The requests ``later`` took: one run of their inputs stacked on the batch axis (the
        active variant taken once), each answered its rows of every output, encoded as
        ``answer`` encodes. Anything unexpected (the model swapped, a runtime error, outputs
        that are not one row per input row) declines them all to the generic path, each
        answered alone there as without batching (so is a batch whose stacked inputs do not fit
        the memory budget); an error of a batch's run also turns this plan's batches off."""
        pending, self._pending = self._pending, []
        count = len(pending)
        self._company = count
        answers: list[tuple[bytes, str] | None] = [None] * count
        members: list[Mapping[str, np.ndarray]] = []  # each request's rows of the outputs
        variant_id, ran = "", 0.0
        model = self.model()
        arrays = [member[2] for member in pending]
        budget = self.budget
        # The stacked copy of the inputs is memory of its own (a raw body's input is a view of
        # the body, held already): charged while the batch runs, or the batch is declined.
        stack = sum(array.nbytes for array in arrays) if count > 1 else 0
        with budget.lock:
            fits = budget.used + stack <= budget.capacity
            if fits:
                budget.used += stack
        if fits and model is not None and self.server.model is model:
            try:
                variant = model.active
                run = variant.loaded.run if variant.takes_public_feeds else variant.run
                stacked = arrays[0] if count == 1 else np.concatenate(arrays)
                started = perf_counter()
                outputs = run({self._input: stacked})
                ran = perf_counter() - started
                if count == 1:
                    answers[0] = self.encode(outputs, variant.id)
                    members.append(outputs)
                else:
                    rows = len(stacked)
                    if any(output.ndim == 0 or output.shape[0] != rows for output in outputs.values()):
                        raise InferenceInputError("outputs not one row per input row")
                    at = 0
                    for index, array in enumerate(arrays):
                        end = at + len(array)
                        rows_of = {k: v[at:end] for k, v in outputs.items()}
                        answers[index] = self.encode(rows_of, variant.id)
                        members.append(rows_of)
                        at = end
                variant_id = variant.id
            except Exception as exc:  # noqa: BLE001 - every error is the generic path's to answer (see module)
                # The inputs were checked one by one: what fails here is the batch itself (outputs
                # without a batch axis after all, a runtime that cannot take this batch size), so
                # this plan runs every request alone from now on (a model swapped in prepares anew).
                if count > 1:
                    self.batching = False
                    log.info("prepared route for %s: batches off (%r)", self.known.path, exc)
                answers = [None] * count
                variant_id = ""
        if fits:
            with budget.lock:
                budget.used -= stack
        head, known = self.head, self.known
        for (connection, body, _, allowance), answer in zip(pending, answers, strict=True):
            self._finish(allowance)
            try:
                connection.answer_later(known, body, answer, head)
            except Exception:  # noqa: BLE001 - one broken connection must not keep the others waiting
                log.exception("answering a batched request failed")
        if variant_id:
            observe = self.server.observe
            for _ in range(count):
                observe(variant_id, ran)
            if count > 1:
                self.scheduler.metrics.inline_batched += count
            self.scheduler.took(ran / count)  # the loop was blocked for all of them: its share each
            if self.server.taps and model is not None:
                tap, name, feed_name = self.server.tap, model.name, self._input
                for (_, _, array, _), outputs_of in zip(pending, members, strict=True):
                    tap(name, {feed_name: array}, outputs_of, variant_id)

    def _finish(self, allowance: Allowance | None) -> None:
        """A request (holding ``allowance``) no longer counts, nor holds its memory."""
        self.scheduler.requests.count -= 1
        budget = self.budget
        with budget.lock:
            budget.used -= self.hold
        if allowance is not None:
            allowance.release()


def prepare(app: ApiApp, request: Request, model_name: str, content_type: str, encoding: str) -> PreparedInfer | None:
    """A plan for the requests with ``request``'s header block, which the generic path has just
    answered 200 inline with these encodings (so its body, of the block's Content-Length, is
    small enough to be answered inline); None when the block cannot have one (another model
    than the main one, dynamic batching, no body, an encoding without a plan, raw tensors that
    are not exactly the model's inputs)."""
    model = app.server.model
    if (
        model is None
        or model.name != model_name
        or model.batcher is not None
        or not app.scheduler.inline_beside_others
        or request.allowance is None
        or request.known is None
        or not request.body
        or encoding not in (RAW, JSON, NPY)
    ):
        return None
    signature = model.signature
    length = len(request.body)
    decode: Decode
    hold, allowances = length, False  # the body; decoders that allocate say more below
    if content_type in (RAW, "application/octet-stream"):
        raw = _raw_decoder(model, request.headers.get("x-tensors", ""), length)
        if raw is None:
            return None
        decode = raw  # views of the body: nothing more to hold
    elif content_type in (JSON, ""):
        decode, bound = _json_decoder(model, length, request.allowance.max_decoded)
        if bound is None:
            allowances = True  # it charges what each body needs
        else:
            hold += bound
    elif content_type == NPY:
        query = request.query
        allowances = True

        def decode(body: bytes, allowance: Allowance | None) -> dict[str, np.ndarray]:
            feeds = decode_npy(body, query, signature, allowance)  # type: ignore[arg-type]  # allowances=True
            signature.check(feeds)
            return feeds

    else:
        return None
    encode = _encoder(model, encoding, request.query)
    return PreparedInfer(
        app,
        model,
        request.known,
        decode,
        encode,
        encoding,
        request.allowance,
        hold,
        allowances,
        _batch_input(app, model),
    )


def _batch_input(app: ApiApp, model: ServedModel) -> str | None:
    """The input a plan may batch on (``PreparedInfer.later``): the model's one input, when the API
    allows batches and every input and output has a dynamic first axis and, the input, fixed
    others (so that requests of one header block stack whatever their batch sizes)."""
    signature = model.signature
    if app.scheduler.inline_batch_max < 2 or len(signature.inputs) != 1:
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


#: After a batch ran alone, one request in this many is taken for a batch (``PreparedInfer.later``).
_PROBE_EVERY = 16
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
