"""Tensor encodings of the inference API.

Requests (``Content-Type``) and responses (``Accept``; default: the request's encoding):

``application/json``
    ``{"inputs": {"image": [[...]]}}`` → ``{"model", "version", "variant", "outputs": {...}}``.
    Numbers are converted to the input's dtype; a fraction for an integer input is refused.
``application/x-npy``
    One ``.npy`` array (``allow_pickle`` off) for a one-input model, or name the input with
    ``?input=NAME``. The response is the single output as ``.npy`` (``?output=NAME`` picks one).
``application/x-npz``
    An ``.npz`` of arrays named like the inputs (multi-input); declared sizes are checked
    before anything is decompressed. The response is an ``.npz`` of the outputs.
``application/x-edgesdk-tensors`` (raw, the fastest)
    Header ``X-Tensors: image=float32[1,1,8,8]; mask=int64[1,16]`` and the arrays' bytes,
    C order, little-endian, concatenated in that order. The response uses the same form.
"""

from __future__ import annotations

import functools
import io
import json
import math
import sys
import tokenize
import zipfile
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import orjson
from edgesdk.agent.api import tensor_json
from edgesdk.agent.api.answer import dumps
from edgesdk.agent.api.budget import Allowance, unlimited_allowance
from edgesdk.agent.nonfinite import all_finite
from edgesdk.agent.tensor_signature import Signature

from edgesdk.errors import AgentError, InferenceInputError
from edgesdk.protocol.tensor_header import MAX_DIM, RAW, TensorEntry, describe, parse_header

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
ENCODINGS = (JSON, NPY, NPZ, RAW)
#: Bytes of an .npy header read before its shape is known (numpy itself allows 10000).
_NPY_HEADER_MAX = 64 * 1024


class DecodeError(AgentError):
    """The request body is not a valid instance of its declared encoding (HTTP 400)."""

    http_status, grpc_status, error_kind, public = 400, "INVALID_ARGUMENT", "bad_request", True


class DeclaredInputError(InferenceInputError):
    """What a request declares (an input's name, dtype or shape; an output it asks for) does not
    fit the model's signature (HTTP 422), found by the API itself (inputs: before the array was
    built), not by the server's own check. The API raises this, never a bare
    InferenceInputError: that one the server counts where it checks, so it is not counted again."""

    error_kind = "bad_input"  # refused by the API, not by the server (which counts its own)


class DecodedValueError(InferenceInputError):
    """A value the body carries that the input's dtype cannot hold (a fraction for an integer
    input, one out of its range, a string), found while decoding it (HTTP 422)."""

    error_kind = "bad_input"  # refused before the server (which counts its own) saw it


class UnsupportedEncodingError(AgentError):
    """Content-Type or Accept names an encoding the API does not speak (HTTP 415/406)."""

    grpc_status, error_kind, public = "INVALID_ARGUMENT", "bad_request", True

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status

    @property
    def status(self) -> int:
        return self.http_status


def media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def response_encoding(accept: str | None, request_type: str) -> str:
    """The encoding to answer in: the first of ours named by Accept, else the request's."""
    if accept:
        for part in accept.split(","):
            candidate = media_type(part)
            if candidate in ENCODINGS:
                return candidate
            if candidate == "application/octet-stream":
                return RAW
        if not any(media_type(p) in ("*/*", "application/*", "") for p in accept.split(",")):
            raise UnsupportedEncodingError(f"cannot answer in {accept!r}; available: {', '.join(ENCODINGS)}", 406)
    return request_type


def decode_request(
    content_type: str,
    body: bytes,
    headers: Mapping[str, str],
    query: str,
    signature: Signature,
    allowance: Allowance | None = None,
) -> dict[str, np.ndarray]:
    """Body → feeds by input name.

    Every array's DECLARED name, dtype and shape are checked against ``signature`` (fixed
    dimensions; rank) and its bytes taken from ``allowance`` (the request's share of the
    server's memory budget) before the array is allocated, so no encoding can make the agent
    allocate more than it allows. The full signature check (NaN/Inf included) comes after, in
    the server."""
    if allowance is None:
        allowance = unlimited_allowance()
    if content_type == JSON or content_type == "":
        return decode_json(body, signature, allowance)
    if content_type == NPY:
        return decode_npy(body, query, signature, allowance)
    if content_type == NPZ:
        return _decode_npz(body, signature, allowance)
    if content_type in (RAW, "application/octet-stream"):
        return _decode_raw(body, headers.get("x-tensors", ""))
    raise UnsupportedEncodingError(
        f"Content-Type {content_type!r} not supported; use one of {', '.join(ENCODINGS)}", 415
    )


def check_declared(signature: Signature, name: str, shape: tuple[int, ...], dtype: np.dtype[Any] | None = None) -> int:
    """What an encoding declares for input ``name``, checked before the array exists: the
    input is the model's, ``dtype`` (when the encoding carries one) is its dtype, the rank and
    every fixed dimension match, and it is not empty. Returns the array's size in bytes (in the
    input's dtype); InferenceInputError (422) names the problem, as ``Signature.check`` would."""
    known = signature.declared_nbytes.get((name, shape))
    if known is not None and (dtype is None or dtype == signature.by_name[name].dtype):
        return known  # this shape of this input passed before: the same answer
    slot = signature.by_name.get(name)
    if slot is None:
        raise DeclaredInputError(f"unknown input {name!r}; the model takes {list(signature.by_name)}")
    if dtype is not None and dtype != slot.dtype:
        label = dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, non-native byte order)"
        raise DeclaredInputError(f"input {name!r}: dtype {label}, expected {slot.dtype.name}")
    if len(shape) != len(slot.shape):
        raise DeclaredInputError(
            f"input {name!r}: shape {list(shape)} has rank {len(shape)}, expected rank {len(slot.shape)} "
            f"{list(slot.shape)}"
        )
    for axis, size in slot.fixed_axes:
        if shape[axis] != size:
            raise DeclaredInputError(
                f"input {name!r}: shape {list(shape)} does not match {list(slot.shape)} (axis {axis} must be {size})"
            )
    count = math.prod(shape)
    if count == 0:
        raise DeclaredInputError(f"input {name!r}: shape {list(shape)} is empty")
    nbytes = count * slot.dtype.itemsize
    if len(signature.declared_nbytes) < _DECLARED_SHAPES_MAX:
        signature.declared_nbytes[(name, shape)] = nbytes
    return nbytes


#: Declared shapes remembered per model (see ``Signature.declared_nbytes``).
_DECLARED_SHAPES_MAX = 256


def json_shape(value: Any, name: str) -> tuple[int, ...]:
    """The shape nested JSON lists declare (their lengths along the first elements), read
    before numpy builds anything; ragged lists are found by numpy afterwards."""
    shape: list[int] = []
    while isinstance(value, list):
        if len(shape) >= 64:
            raise DecodeError(f"input {name!r}: lists nested more than 64 deep")
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(shape)


#: What a JSON body's memory is charged as, in the 413/503 it may get.
JSON_BODY = "the JSON body (use application/x-npy or raw tensors for large inputs)"
#: What one JSON number costs once parsed: its Python object (24-32 bytes) and its slot in a
#: list (8, plus the list's spare room). JSON text costs ~15x its size in memory, not 1x.
JSON_VALUE_BYTES = 40


def json_parse_cost(text: bytes) -> int:
    """Bytes that parsing ``text`` may allocate, bounded before parsing: every value but the
    last is followed by a comma. Counted by ``bytes.count`` for short texts; above
    ``_VECTOR_COUNT_MIN`` by a vectorized compare, ~10x faster (a 3 MB MobileNetV2 body:
    0.14 ms instead of 1.3-2 ms, ~5 % of that request) at the price of a temporary bool array
    of the text's length, charged to nothing: it is freed before parsing starts."""
    if len(text) < _VECTOR_COUNT_MIN:
        commas = text.count(b",")
    else:
        commas = int(np.count_nonzero(np.frombuffer(text, np.uint8) == _COMMA))
    return (commas + 1) * JSON_VALUE_BYTES


_VECTOR_COUNT_MIN = 16 * 1024
_COMMA = ord(",")


def parse_json(text: bytes) -> Any:
    """JSON text → Python values with orjson; DecodeError (400) when it is not JSON."""
    return _parse_json(text)[0]


def _parse_json(text: bytes) -> tuple[Any, bool]:
    """(``parse_json(text)``, whether orjson read it: strict JSON, no NaN, Infinity or integer
    beyond 64 bits)."""
    try:
        return orjson.loads(text), True
    except orjson.JSONDecodeError:
        # Strict JSON has no NaN/Infinity, but Python's json.dumps writes them: read that
        # dialect too, so such an input gets its 422 (NaN or Inf), not a 400.
        try:
            return json.loads(text), False
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"malformed JSON: {exc}") from exc
        except RecursionError:  # orjson stops at 1024 levels; the stdlib parser would recurse on
            raise DecodeError("malformed JSON: nested too deep") from None


def only_key_strings(text: bytes, keys: int) -> bool:
    """True when JSON ``text``, parsed already and found to hold ``keys`` object keys, holds no
    other string: exactly two quotes per key, none left (an escaped quote in a key, a string
    value or another key adds quotes; no string has fewer than two). Then its values are
    numbers, booleans, nulls, lists and (empty) objects only, and numpy may read them straight
    into a float dtype (it would parse strings into numbers: "1.5" → 1.5).

    The last quote is found first (memrchr, ``bytes.rfind``): in a body of numbers only, every
    quote is before it, and the keys come first, so the rest is short: counted with one
    ``bytes.count`` up to it when that is short, else the first ``2 * keys`` quotes are found
    with memchr (``bytes.find``) and the last of them must be the last one. A 3 MB MobileNetV2
    body takes ~0.2 ms, a tiny model's ~0.4 µs (counting all its quotes: ~1 µs)."""
    last = text.rfind(b'"')
    if last < _COUNT_QUOTES_MAX:
        return text.count(b'"', 0, last + 1) == 2 * keys
    find = text.find
    at = -1
    for _ in range(2 * keys):
        at = find(b'"', at + 1)
        if at < 0:
            return False
    return at == last


#: The longest stretch (up to the last quote) that only_key_strings counts with ``bytes.count``
#: (~0.6 ns a byte, one call) rather than a few memchr calls (~0.1 µs a call).
_COUNT_QUOTES_MAX = 2048


def decode_json(body: bytes, signature: Signature, allowance: Allowance) -> dict[str, np.ndarray]:
    # Charged before it is allocated, given back once it is garbage (the parsed document, the
    # float64 arrays numpy reads first): requests decoded and waiting for their answer then
    # hold their body and arrays only. (Holding the parse cost until the answer refused ~1 %
    # of 16 clients posting 3 MB MobileNetV2 JSON with 503: ten requests decoded at once while
    # the event loop waited for the GIL to send their answers held 130 of the 128 MiB.)
    if len(body) >= tensor_json.MIN_BODY_BYTES and len(signature.inputs) == 1:
        # A large body of one float input: simdjson reads it into one buffer (tensor_json);
        # None for anything it does not answer exactly as the reading below would.
        slot = signature.inputs[0]
        if slot.dtype.kind == "f" and tensor_json.AVAILABLE:
            feed = tensor_json.read_tensor(body, slot.name, slot.dtype, allowance)
            if feed is not None:
                check_declared(signature, slot.name, feed.shape)
                return {slot.name: feed}
    temporary = json_parse_cost(body)
    allowance.take_decoded(temporary, JSON_BODY)
    document, strict = _parse_json(body)
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), dict):
        raise DecodeError('JSON body must be an object {"inputs": {"<name>": [...]}}')
    inputs = document["inputs"]
    # Numbers only (see only_key_strings; orjson has read no NaN and no huge integer): a float
    # input is read straight into its dtype, as a hand-written server would, saving numpy's
    # float64 reading and its conversion (~1 ms of a 3 MB MobileNetV2 body's 16).
    numbers_only = strict and len(document) == 1 and only_key_strings(body, 1 + len(inputs))
    feeds: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        slot = signature.by_name.get(name)
        if slot is None:
            raise DeclaredInputError(f"unknown input {name!r}; the model takes {list(signature.by_name)}")
        nbytes = check_declared(signature, name, json_shape(value, name))
        # numpy reads the numbers as int64/float64 first, then converts: both are held at once.
        reading = nbytes // slot.dtype.itemsize * 8
        allowance.take_decoded(nbytes + reading, f"input {name!r}")
        if numbers_only and slot.dtype.kind == "f":
            feed = float_feed(value, slot.dtype)
            if feed is not None:
                feeds[name] = feed
                temporary += reading  # charged (the general reading may follow), never allocated
                continue
        raw = _numbers(value, name)
        if slot.dtype.kind in "iu" and raw.dtype.kind == "f":
            if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
                raise DecodedValueError(f"input {name!r}: expected integers ({slot.dtype.name}), got fractions")
        if slot.dtype.kind in "iu" and raw.size and raw.dtype.kind in "iuf":
            info = np.iinfo(slot.dtype)
            if raw.min() < info.min or raw.max() > info.max:
                raise DecodedValueError(f"input {name!r}: values out of range for {slot.dtype.name}")
        feeds[name] = feed = raw.astype(slot.dtype, copy=False)
        if feed is not raw:
            temporary += raw.nbytes
    allowance.give_back(temporary)  # the parsed numbers are freed as this returns
    return feeds


def float_feed(value: Any, dtype: np.dtype[Any]) -> np.ndarray | None:
    """``value`` (numbers only) read straight into float ``dtype``; None where that is not the
    whole story, for the general reading to answer as it always has: a null (numpy reads it as
    NaN), an overflow to Inf (1e39 for float32), ragged lists or an object in a list."""
    try:
        feed = np.asarray(value, dtype)
    except (ValueError, TypeError):
        return None
    # all_finite's first test (agent/nonfinite.py): x·x is finite when every element is.
    if math.isfinite(np.vdot(feed, feed)) or all_finite(feed):
        return feed
    return None


def _numbers(value: Any, name: str) -> np.ndarray:
    """``value`` as numpy reads nested lists (numbers as int64/float64), refusing anything else."""
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"input {name!r}: not a rectangular array of numbers ({exc})") from exc
    if raw.dtype.kind not in "biuf":
        raise DecodedValueError(f"input {name!r}: values must be numbers (got {raw.dtype.kind!r} data)")
    return raw


def _npy_header(stream: Any, what: str) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """(shape, fortran_order, dtype, header bytes) of the .npy at the start of ``stream``, read
    without reading (or allocating) the array itself."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=_NPY_HEADER_MAX)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=_NPY_HEADER_MAX)
        else:  # pragma: no cover - read_magic refuses other versions itself
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError) as exc:
        # TokenError: numpy re-reads a header that is not a Python literal with tokenize, which
        # raises it for an unclosed one (it is no SyntaxError; it was a 500 before).
        raise DecodeError(f"{what}: not a valid .npy array ({exc})") from exc
    if dtype.hasobject:
        raise DecodeError(f"{what}: .npy arrays of Python objects are not accepted (they need pickle)")
    if any(d > MAX_DIM for d in shape):
        raise DecodeError(f"{what}: .npy shape {list(shape)} has a dimension over {MAX_DIM}")
    return tuple(shape), bool(fortran), dtype, stream.tell()


#: .npy header bytes → what they declare. numpy parses a header in Python (``literal_eval`` of
#: a dict): ~35 % of the instructions of a tiny model's whole .npy request (callgrind), and a
#: client sends the same header with every request. The key is the exact header, so a hit is
#: what parsing it again would give; bounded, since headers are the client's to write.
_NPY_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype[Any], int]] = {}
_NPY_HEADERS_MAX = 256
_NPY_KEY_MAX = 4096  # numpy writes 128 bytes for most arrays; a 64 KiB header is parsed each time


def _npy_body_header(body: bytes, what: str) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """``_npy_header`` of a whole .npy body, remembered per header (see ``_NPY_HEADERS``)."""
    # The .npy layout: 6 magic bytes, major and minor version, the header's length (2 bytes
    # little-endian in version 1, 4 in versions 2 and 3), the header.
    major = body[6] if len(body) > 6 else 0
    size_end = 10 if major == 1 else 12
    end = size_end + int.from_bytes(body[8:size_end], "little")
    key = bytes(body[:end])  # hashable also when the body is a bytearray (a large upload)
    known = _NPY_HEADERS.get(key)
    if known is not None:
        return known
    parsed = _npy_header(io.BytesIO(body), what)
    if parsed[3] == end and end <= _NPY_KEY_MAX and len(_NPY_HEADERS) < _NPY_HEADERS_MAX:
        _NPY_HEADERS[key] = parsed
    return parsed


def _npy_bytes(array: np.ndarray) -> bytes:
    """``np.save`` of ``array`` (C order), its header built once per dtype and shape: numpy
    writes the header in Python (a dict's repr, padding), as costly as parsing one."""
    array = np.ascontiguousarray(array)
    key = (array.dtype.str, array.shape)
    header = _NPY_SAVED_HEADERS.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        saved = buffer.getvalue()
        if len(_NPY_SAVED_HEADERS) < _NPY_HEADERS_MAX:  # output shapes: the model's, a few
            _NPY_SAVED_HEADERS[key] = saved[: len(saved) - array.nbytes]
        return saved
    return header + array.tobytes()


_NPY_SAVED_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def _shaped(flat: np.ndarray, shape: tuple[int, ...], fortran: bool) -> np.ndarray:
    array = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
    # A header of any length may leave the data at an odd address: runtimes want aligned arrays.
    return array if array.flags.aligned else array.copy()


def decode_npy(body: bytes, query: str, signature: Signature, allowance: Allowance) -> dict[str, np.ndarray]:
    names = parse_qs(query).get("input")
    if names:
        name = names[0]
    elif len(signature.inputs) == 1:
        name = signature.inputs[0].name
    else:
        raise DecodeError(
            f"the model takes {len(signature.inputs)} inputs; send application/x-npz, or name one with ?input=NAME"
        )
    what = f"input {name!r}"
    shape, fortran, dtype, offset = _npy_body_header(body, what)
    check_declared(signature, name, shape, dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if len(body) - offset != nbytes:
        raise DecodeError(
            f"{what}: the .npy header declares {list(shape)} {dtype.name} ({nbytes} bytes), "
            f"the body holds {len(body) - offset}"
        )
    # The body holds the array already: a view of it, nothing allocated (the body is charged).
    return {name: _shaped(np.frombuffer(body, dtype=dtype, offset=offset), shape, fortran)}


def _decode_npz(body: bytes, signature: Signature, allowance: Allowance) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DecodeError(f"not a valid .npz archive ({exc})") from exc
    # The zip directory declares every member's uncompressed size: check them all, and each
    # member's .npy header against the signature and the budget, before inflating anything
    # past a header (a few kB of deflate can declare gigabytes).
    planned: list[tuple[str, Any, tuple[int, ...], bool, np.dtype[Any], int]] = []
    for info in members:
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        what = f"input {name!r}"
        if name not in signature.by_name:
            raise DeclaredInputError(f"unknown input {name!r}; the model takes {list(signature.by_name)}")
        if any(name == other for other, *_ in planned):
            raise DecodeError(f"{what}: given twice in the .npz")
        try:
            member = archive.open(info)
            shape, fortran, dtype, offset = _npy_header(member, what)
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError) as exc:
            raise DecodeError(f"{what}: unreadable in the .npz ({exc})") from exc
        check_declared(signature, name, shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if info.file_size != offset + nbytes:
            raise DecodeError(
                f"{what}: the zip directory declares {info.file_size} bytes, its .npy header "
                f"{offset + nbytes} ({list(shape)} {dtype.name})"
            )
        planned.append((name, member, shape, fortran, dtype, nbytes))
    for name, _, _, _, _, nbytes in planned:
        allowance.take_decoded(nbytes, f"input {name!r}")
    feeds: dict[str, np.ndarray] = {}
    for name, member, shape, fortran, dtype, nbytes in planned:
        flat = np.empty(nbytes // dtype.itemsize, dtype=dtype)
        target = memoryview(flat).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
        filled = 0
        try:
            # Inflated a MiB at a time straight into the array (ZipExtFile.readinto would read
            # the whole member into a temporary bytes object first: twice the memory).
            while filled < nbytes:
                piece = member.read(min(1 << 20, nbytes - filled))
                if not piece:
                    break
                target[filled : filled + len(piece)] = piece
                filled += len(piece)
            extra = member.read(1)
        except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
            raise DecodeError(f"input {name!r}: unreadable in the .npz ({exc})") from exc
        if filled != nbytes or extra:
            raise DecodeError(f"input {name!r}: the .npz member holds other than the {nbytes} bytes it declares")
        feeds[name] = _shaped(flat, shape, fortran)
    return feeds


@functools.lru_cache(maxsize=256)
def tensor_entries(header: str) -> tuple[TensorEntry, ...]:
    """``"a=float32[1,8]; b=int64[1]"`` → one (name, dtype, shape, count) entry per tensor."""
    # Cached here too (parse_header is): one call per request on the hot path, as before.
    if not header.strip():
        raise DecodeError("raw tensors need an X-Tensors header, e.g. 'X-Tensors: image=float32[1,1,8,8]'")
    try:
        return parse_header(header)  # cached there: clients repeat the same header
    except ValueError as exc:
        raise DecodeError(str(exc)) from None


def _decode_raw(body: bytes, header: str) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, shape, count in tensor_entries(header):
        size = count * dtype.itemsize
        if offset + size > len(body):
            raise DecodeError(f"body has {len(body)} bytes; X-Tensors needs at least {offset + size} (at {name!r})")
        if count == 0:
            raise DeclaredInputError(f"input {name!r}: shape {list(shape)} is empty")
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
        if not dtype.isnative:  # a big-endian host: swap to native order once, here
            array = array.astype(dtype.newbyteorder("="))
        feeds[name] = array
        offset += size
    if offset != len(body):
        raise DecodeError(f"body has {len(body)} bytes; X-Tensors describes {offset}")
    return feeds


def encode_response(
    encoding: str, outputs: Mapping[str, np.ndarray], *, model: str, version: str, variant: str, query: str
) -> tuple[bytes, str | None]:
    """Outputs → (body, the raw tensors' layout, for raw tensors; else None) in ``encoding``."""
    if encoding == JSON:
        # Arrays go to orjson as they are: float32 outputs are written as float32 (the shortest
        # text that reads back to the same float32), half the size of their float64 digits.
        body = dumps({"model": model, "version": version, "variant": variant, "outputs": dict(outputs)})
        return body, None
    if encoding == NPY:
        names = parse_qs(query).get("output")
        if names:
            if names[0] not in outputs:
                raise DeclaredInputError(f"unknown output {names[0]!r}; the model has {list(outputs)}")
            array = outputs[names[0]]
        elif len(outputs) == 1:
            array = next(iter(outputs.values()))
        else:
            raise UnsupportedEncodingError(
                f"the model has {len(outputs)} outputs; ask for application/x-npz or pick one with ?output=NAME", 406
            )
        return _npy_bytes(array), None
    if encoding == NPZ:
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.ascontiguousarray(v) for k, v in outputs.items()})  # type: ignore[arg-type]
        return buffer.getvalue(), None
    parts = []
    descriptions = []
    for name, array in outputs.items():
        order = array.dtype.byteorder
        little = order == "<" or order == "|" or (order == "=" and _NATIVE_LITTLE)
        if not (little and array.flags.c_contiguous):
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        parts.append(array.tobytes())
        descriptions.append(describe(name, array.dtype, array.shape))
    return parts[0] if len(parts) == 1 else b"".join(parts), "; ".join(descriptions)


_NATIVE_LITTLE = sys.byteorder == "little"
