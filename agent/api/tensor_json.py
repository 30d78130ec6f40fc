"""A large JSON body's one float tensor, read by simdjson into one flat buffer: no Python object
per number.

Why: orjson's document of a 3 MB MobileNetV2 body is 150,528 Python floats in 677 lists, built
(~4.6 ms) only for numpy to read them back (~2.7 ms); simdjson parses the same text and copies
its numbers into one float64 buffer in ~3.6 ms, and the memory charge's count adds ~0.7 ms
(``decode_json`` in all: 5.1 against 7.9 ms; benchmarks/probe_json_decode.py, in git at e3a1c3b;
issue 15, tenth session).

Only the usual body takes this road: ``{"inputs": {"<name>": [[...]]}}`` holding one float
input as rectangular lists of numbers, no string but the two keys. Anything else (another
document, NaN or Infinity, a null or a boolean, ragged or empty lists, a number that overflows
the dtype, a body over the memory this road would need) makes :func:`read_tensor` return None,
having given back what it took, and ``codec.decode_json`` reads the body with orjson as it
always has: every answer but its time is the same whichever road a body takes
(tests/unit/test_agent_tensor_json.py reads the same bodies both ways).

simdjson (the ``pysimdjson`` wheel) is part of the agent extra; without it every body takes the
orjson road.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from edgesdk.agent.api.budget import Allowance, BudgetRefused
from edgesdk.agent.nonfinite import all_finite

try:
    from simdjson import Array, Object, Parser
except ImportError:  # an optional speed-up: the orjson road answers without it
    Array = Object = Parser = None  # type: ignore[misc, assignment]

#: Whether this road is open (the wheel is installed).
AVAILABLE = Parser is not None

#: Bodies shorter than this take the orjson road: there it costs about the same, and a tiny
#: model's body is answered inline, where every call counts.
MIN_BODY_BYTES = 16 * 1024

#: Deeper lists take the orjson road (which refuses them: codec.json_shape).
MAX_RANK = 64

#: At most this many ``[`` are found one by one (see _count_opens); more are counted in bulk.
FIND_OPENS_MAX = 4096

#: The two keys must end within this many bytes: every string of the body is then in its first
#: few bytes (simdjson copies strings out of the text; see ``parse_cost``).
HEAD_BYTES = 4096

#: The parser's own allocations and the pages its buffers round up to.
_PARSER_BYTES = 256 * 1024

_DASH = np.uint8(ord("-"))  # '-', '.', '/', '0'-'9' are 0x2D-0x39: shifted to 0-12
_OPEN = np.uint8(ord("["))


def parse_cost(body: bytes, tail: int) -> tuple[int, int, int]:
    """(bytes simdjson may touch parsing ``body``, its float64 copy of the numbers included;
    the lists opened in ``body[tail:]`` (its ``[``); the *separators* of ``body``: its bytes
    but ``-./0-9``). ``body[:tail]`` is at most HEAD_BYTES long and holds every quote of the
    body.

    * the text, copied once (padded);
    * stage 1 indexes every structural byte (``,:[]{}``, a quote, the first byte of each
      number or literal) at 4 bytes each, in the whole text before anything is checked: a
      structural byte is a separator or the first byte after one, so there are at most
      2 * separators + 1;
    * stage 2 writes the tape up to the first error: 2 words per list, object and scalar (a
      number, a literal, a string), 2 for the root. Each scalar follows a separator; past the
      head, where no string (so no key) can be valid, an object's ``{`` is a separator no
      scalar follows, and a list's ``[`` is counted;
    * as_buffer copies each number into 8 bytes.

    A MobileNetV2 body as json.dumps writes it (``, `` between numbers) is charged ~4.3x its
    size (orjson's road charges ~2x), and no body, however written, touches more
    (tests/unit/test_agent_tensor_json.py measures the worst bodies it knows)."""
    codes = np.frombuffer(body, np.uint8)
    # One scratch buffer of the text's size, used for each pass in turn: a second one alive
    # beside it was fresh pages on every call (glibc gives back a free top over twice the
    # largest block), ~0.5 ms of page faults for a 3 MB body.
    marks = np.empty(len(body), np.bool_)
    opens = _count_opens(body, tail)
    if opens < 0:  # many short rows: one vectorized pass
        opens = int(np.count_nonzero(np.equal(codes[tail:], _OPEN, out=marks[tail:])))
    shifted = np.subtract(codes, _DASH, out=marks.view(np.uint8))  # wraps: separators are 13-255
    separators = int(np.count_nonzero(np.greater(shifted, 12, out=marks)))
    cost = (
        len(body)
        + 64
        + 4 * min(len(body), 2 * separators + 1)
        + 24 * (separators + 1)  # the scalars' tape and float64 copy; the objects' tape
        + 16 * (opens + 1)  # the lists and the root
        + 16 * tail  # the head's lists (its scalars follow its separators) and strings
        + _PARSER_BYTES
    )
    return cost, opens, separators


def _count_opens(body: bytes, tail: int) -> int:
    """The ``[`` in ``body[tail:]`` found one by one with memchr (``bytes.find``), or -1 past
    FIND_OPENS_MAX of them. A tensor has few lists for its size (MobileNetV2's 3 MB: 677): a
    read of the text and a call per list, where a numpy compare writes a flag per byte and
    counts them again (under wrk beside the model's threads, ~0.75 ms against ~0.23 ms for a
    read of the same 3 MB)."""
    find = body.find
    at = tail - 1
    for count in range(FIND_OPENS_MAX + 1):
        at = find(b"[", at + 1)
        if at < 0:
            return count
    return -1


def read_tensor(body: bytes, name: str, dtype: np.dtype[Any], allowance: Allowance) -> np.ndarray | None:
    """Input ``name`` of ``body`` as a ``dtype`` array, or None: this road does not answer it.
    On success the array's bytes stay charged to ``allowance`` (as decode_json charges them);
    on None nothing does."""
    if Parser is None:
        return None
    last_quote = body.rfind(b'"', 0, HEAD_BYTES)
    if last_quote < 0 or body.find(b'"', last_quote + 1) >= 0:
        return None  # a string after the head (or no key at all): the orjson road's
    cost, opens, _ = parse_cost(body, last_quote + 1)
    if allowance.decoded + cost > allowance.max_decoded:
        return None  # over the per-request cap: orjson's smaller charge may fit
    try:
        allowance.take_decoded(cost, "the JSON body")
    except BudgetRefused:
        return None  # the orjson road answers (its smaller charge may fit now)
    feed = None
    try:
        values, shape = _flat_numbers(body, name, opens)
        if values is None:
            return None
        # The parser's memory is freed (its document is gone); the array takes less than its
        # tape did, so the charge covers both.
        with np.errstate(over="ignore"):  # 1e39 → Inf for float32: refused just below
            feed = values.astype(dtype).reshape(shape)
        del values
        # float_feed's test (codec): x·x is finite when every element is.
        if not math.isfinite(np.vdot(feed, feed)) and not all_finite(feed):
            feed = None
        return feed
    finally:
        if feed is None:
            allowance.refund(cost)  # as if never taken: the orjson road charges its own
        else:
            # The parse is garbage now; the array stays charged until the answer, as
            # decode_json's arrays are (and the request's cap counts it all, as there).
            allowance.give_back(cost - feed.nbytes)


def _flat_numbers(body: bytes, name: str, opens: int) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """The numbers of ``{"inputs": {name: [...]}}`` as a flat float64 array and their shape;
    (None, ()) for any other body. The parser and its document are freed as this returns."""
    try:
        document = Parser().parse(body)
        if type(document) is not Object or len(document) != 1:
            return None, ()
        inputs = document.get("inputs")
        if type(inputs) is not Object or len(inputs) != 1:
            return None, ()
        tensor = inputs.get(name)
        if type(tensor) is not Array:
            return None, ()
        shape = _rectangular_shape(tensor)
        # Every list the shape has, checked above, and no other list after the keys: then the
        # innermost lists hold no list (as_buffer would flatten one into their numbers), and
        # as_buffer refuses anything else but numbers.
        if shape is None or opens != _lists_in(shape):
            return None, ()
        values = np.frombuffer(tensor.as_buffer(of_type="d"), np.float64)
    except (ValueError, TypeError, RuntimeError, KeyError, IndexError):
        return None, ()  # not JSON, too deep, a null, a boolean, an object, a huge number, ...
    if values.size != math.prod(shape):
        return None, ()
    return values, shape


def _rectangular_shape(tensor: Any) -> tuple[int, ...] | None:
    """The shape of nested lists with every list of one depth as long as the others (the lists
    of the last depth not looked into); None if they have none: ragged, empty, a number beside
    a list, more than MAX_RANK deep."""
    shape: list[int] = []
    item = tensor
    while type(item) is Array:
        if not len(item) or len(shape) == MAX_RANK:
            return None
        shape.append(len(item))
        item = item[0]
    return tuple(shape) if _conforms(tensor, shape, 0) else None


def _conforms(row: Any, shape: list[int], depth: int) -> bool:
    """Whether list ``row`` at ``depth`` has ``shape[depth:]``, looked at depth first (one path
    of lists held at a time, however many lists there are)."""
    if len(row) != shape[depth]:
        return False
    if depth + 1 == len(shape):
        return True
    for item in row:
        if type(item) is not Array or not _conforms(item, shape, depth + 1):
            return False
    return True


def _lists_in(shape: tuple[int, ...]) -> int:
    """How many lists nested lists of ``shape`` are written with: 1 + d0 + d0*d1 + ..."""
    lists, row = 1, 1
    for size in shape[:-1]:
        row *= size
        lists += row
    return lists
