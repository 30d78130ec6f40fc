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
import re
import sys
import zipfile
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import orjson
from edgesdk.agent.api.http import dumps
from edgesdk.agent.signature import Signature

from edgesdk.errors import AgentError, InferenceInputError

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
RAW = "application/x-edgesdk-tensors"
ENCODINGS = (JSON, NPY, NPZ, RAW)

_RAW_ITEM = re.compile(r"^\s*([^=;\s]+)\s*=\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*$")
_RAW_DTYPES = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}


class DecodeError(AgentError):
    """The request body is not a valid instance of its declared encoding (HTTP 400)."""


class UnsupportedEncodingError(AgentError):
    """Content-Type or Accept names an encoding the API does not speak (HTTP 415/406)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


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
    content_type: str, body: bytes, headers: Mapping[str, str], query: str, signature: Signature
) -> dict[str, np.ndarray]:
    """Body → feeds by input name (signature checks come after, in the server)."""
    if content_type == JSON or content_type == "":
        return _decode_json(body, signature)
    if content_type == NPY:
        return _decode_npy(body, query, signature)
    if content_type == NPZ:
        return _decode_npz(body, signature)
    if content_type in (RAW, "application/octet-stream"):
        return _decode_raw(body, headers.get("x-tensors", ""))
    raise UnsupportedEncodingError(
        f"Content-Type {content_type!r} not supported; use one of {', '.join(ENCODINGS)}", 415
    )


def _decode_json(body: bytes, signature: Signature) -> dict[str, np.ndarray]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Strict JSON has no NaN/Infinity, but Python's json.dumps writes them: read that
        # dialect too, so such an input gets its 422 (NaN or Inf), not a 400.
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"malformed JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), dict):
        raise DecodeError('JSON body must be an object {"inputs": {"<name>": [...]}}')
    feeds: dict[str, np.ndarray] = {}
    for name, value in document["inputs"].items():
        slot = signature.by_name.get(name)
        if slot is None:
            raise InferenceInputError(f"unknown input {name!r}; the model takes {list(signature.by_name)}")
        try:
            raw = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"input {name!r}: not a rectangular array of numbers ({exc})") from exc
        if raw.dtype.kind not in "biuf":
            raise InferenceInputError(f"input {name!r}: values must be numbers (got {raw.dtype.kind!r} data)")
        if slot.dtype.kind in "iu" and raw.dtype.kind == "f":
            if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
                raise InferenceInputError(f"input {name!r}: expected integers ({slot.dtype.name}), got fractions")
        if slot.dtype.kind in "iu" and raw.size and raw.dtype.kind in "iuf":
            info = np.iinfo(slot.dtype)
            if raw.min() < info.min or raw.max() > info.max:
                raise InferenceInputError(f"input {name!r}: values out of range for {slot.dtype.name}")
        feeds[name] = raw.astype(slot.dtype, copy=False)
    return feeds


def _load_npy(data: bytes, what: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DecodeError(f"{what}: not a valid .npy array ({exc})") from exc
    if not isinstance(array, np.ndarray):
        raise DecodeError(f"{what}: expected one .npy array")
    return array


def _decode_npy(body: bytes, query: str, signature: Signature) -> dict[str, np.ndarray]:
    names = parse_qs(query).get("input")
    if names:
        name = names[0]
    elif len(signature.inputs) == 1:
        name = signature.inputs[0].name
    else:
        raise DecodeError(
            f"the model takes {len(signature.inputs)} inputs; send application/x-npz, or name one with ?input=NAME"
        )
    return {name: _load_npy(body, f"input {name!r}")}


def _decode_npz(body: bytes, signature: Signature) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DecodeError(f"not a valid .npz archive ({exc})") from exc
    # An archive could decompress to far more than it weighs: refuse before inflating.
    if declared > max(len(body) * 2, 1 << 20) and declared > 64 * len(body):
        raise DecodeError(f".npz declares {declared} bytes of arrays in a {len(body)}-byte body (compression bomb?)")
    feeds: dict[str, np.ndarray] = {}
    for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        try:
            feeds[name] = _load_npy(archive.read(info), f"input {name!r}")
        except (zipfile.BadZipFile, OSError, RuntimeError) as exc:
            raise DecodeError(f"input {name!r}: unreadable in the .npz ({exc})") from exc
    return feeds


def parse_tensor_header(header: str) -> list[tuple[str, np.dtype[Any], tuple[int, ...]]]:
    """``"a=float32[1,8]; b=int64[1]"`` → [(name, dtype, shape)]."""
    return [(name, dtype, shape) for name, dtype, shape, _ in _parse_tensor_header(header)]


@functools.lru_cache(maxsize=256)
def _parse_tensor_header(header: str) -> tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]:
    # Cached: a client sends the same X-Tensors line with every request, and parsing it
    # (regex, dtype objects) costs as much as a tiny model's whole inference.
    if not header.strip():
        raise DecodeError("raw tensors need an X-Tensors header, e.g. 'X-Tensors: image=float32[1,1,8,8]'")
    items = []
    for part in header.split(";"):
        match = _RAW_ITEM.match(part)
        if not match:
            raise DecodeError(f"X-Tensors entry {part.strip()!r} is not NAME=DTYPE[D1,D2,...]")
        name, dtype, dims = match.groups()
        if dtype not in _RAW_DTYPES:
            raise DecodeError(
                f"X-Tensors entry {name!r}: unknown dtype {dtype!r}; known: {', '.join(sorted(_RAW_DTYPES))}"
            )
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
        items.append((name, np.dtype(dtype).newbyteorder("<"), shape, math.prod(shape)))
    return tuple(items)


def _decode_raw(body: bytes, header: str) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, shape, count in _parse_tensor_header(header):
        size = count * dtype.itemsize
        if offset + size > len(body):
            raise DecodeError(f"body has {len(body)} bytes; X-Tensors needs at least {offset + size} (at {name!r})")
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
) -> tuple[bytes, list[tuple[str, str]]]:
    """Outputs → (body, extra headers) in ``encoding``."""
    if encoding == JSON:
        # Arrays go to orjson as they are: float32 outputs are written as float32 (the shortest
        # text that reads back to the same float32), half the size of their float64 digits.
        body = dumps({"model": model, "version": version, "variant": variant, "outputs": dict(outputs)})
        return body, []
    if encoding == NPY:
        names = parse_qs(query).get("output")
        if names:
            if names[0] not in outputs:
                raise InferenceInputError(f"unknown output {names[0]!r}; the model has {list(outputs)}")
            array = outputs[names[0]]
        elif len(outputs) == 1:
            array = next(iter(outputs.values()))
        else:
            raise UnsupportedEncodingError(
                f"the model has {len(outputs)} outputs; ask for application/x-npz or pick one with ?output=NAME", 406
            )
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        return buffer.getvalue(), []
    if encoding == NPZ:
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.ascontiguousarray(v) for k, v in outputs.items()})  # type: ignore[arg-type]
        return buffer.getvalue(), []
    parts = []
    descriptions = []
    for name, array in outputs.items():
        order = array.dtype.byteorder
        little = order == "<" or order == "|" or (order == "=" and _NATIVE_LITTLE)
        if not (little and array.flags.c_contiguous):
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        parts.append(array.tobytes())
        descriptions.append(_describe(name, array.dtype, array.shape))
    return parts[0] if len(parts) == 1 else b"".join(parts), [("X-Tensors", "; ".join(descriptions))]


_NATIVE_LITTLE = sys.byteorder == "little"


@functools.lru_cache(maxsize=256)
def _describe(name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    # Cached: the same few outputs every request, and numpy builds dtype.name anew each time.
    return f"{name}={dtype.name}[{','.join(map(str, shape))}]"
