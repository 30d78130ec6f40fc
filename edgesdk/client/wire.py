"""What the agent clients send and read, shared by the sync and async transports.

Tensors travel in the agent's raw encoding (``application/x-edgesdk-tensors``: an
``X-Tensors`` header and the arrays' little-endian C-order bytes), the cheapest it speaks:
no JSON numbers, no zip, and the request body is the arrays' own memory (no copy). A single
array without a name goes as ``.npy`` so the agent names it after the model's only input.
The answer is asked for in the raw encoding and decoded into writable numpy arrays.

The ``X-Tensors`` header is ``edgesdk.protocol.tensor_header``'s, which the agent reads and
writes too; this module does not import the agent (host code never does).
``tests/unit/test_client.py`` round-trips requests and answers through the agent's own codec.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from edgesdk.errors import (
    AgentInputError,
    AgentNotFoundError,
    AgentRequestError,
    AgentTimeoutError,
    AgentUnavailableError,
    UsageError,
)
from edgesdk.protocol import tensor_header
from edgesdk.protocol.tensor_header import RAW

DEFAULT_URL = "http://127.0.0.1:8470"
JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
#: The dtypes the raw encoding names; anything else goes as .npz (and the agent says what it wants).
RAW_DTYPES = tensor_header.DTYPES

#: The request body: parts sent one after the other (bytes, or views of the arrays' memory).
Body = list[bytes | memoryview]
ArrayInputs = np.ndarray | Mapping[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """Where the agent listens: TCP host and port, or a Unix socket; ``prefix`` for a proxy path."""

    host: str
    port: int
    unix_socket: str | None = None
    prefix: str = ""

    def url(self, path: str) -> str:
        """The full address of ``path`` for messages."""
        if self.unix_socket:
            return f"unix:{self.unix_socket}:{self.prefix}{path}"
        return f"http://{self.host}:{self.port}{self.prefix}{path}"


def endpoint(url: str | None, unix_socket: str | Path | None) -> Endpoint:
    """``http://host:port[/prefix]`` or a Unix socket path → an :class:`Endpoint`."""
    if unix_socket is not None:
        if url is not None:
            raise UsageError(f"give the agent's url ({url!r}) or its unix_socket ({str(unix_socket)!r}), not both")
        return Endpoint("localhost", 0, str(unix_socket))
    parts = urlsplit(url or DEFAULT_URL)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(
            f"agent url {url!r} is not http://HOST:PORT (the agent serves plain HTTP on loopback, "
            "or pass unix_socket=PATH)"
        )
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise UsageError(f"agent url {url!r}: bad port ({exc})") from exc
    return Endpoint(parts.hostname, port, None, parts.path.rstrip("/"))


@dataclass(frozen=True)
class Call:
    """One HTTP request, ready for either transport."""

    method: str
    path: str
    headers: dict[str, str]
    body: Body
    length: int


def get_call(path: str) -> Call:
    return Call("GET", path, {"Accept": "application/json, text/plain"}, [], 0)


def infer_path(model: str) -> str:
    return f"/v1/models/{quote(model, safe='')}/infer"


def _little_endian(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.hasobject or array.dtype.kind in "USV":
        raise UsageError(f"input {name!r}: {array.dtype} data cannot be sent to a model; use a numeric numpy array")
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _bytes_of(array: np.ndarray) -> memoryview:
    """The array's own memory as bytes (no copy; ``array`` is C-contiguous)."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer


def infer_call(model: str, inputs: ArrayInputs) -> Call:
    """The request that runs ``model`` on ``inputs`` (one array, or arrays by input name)."""
    headers = {"Accept": RAW}
    if isinstance(inputs, np.ndarray):
        array = _little_endian(inputs, "(the only input)")
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, np.lib.format.header_data_from_array_1_0(array))
        body: Body = [buffer.getvalue(), _bytes_of(array)]
        headers["Content-Type"] = NPY
        return Call("POST", infer_path(model), headers, body, sum(len(p) for p in body))
    if not isinstance(inputs, Mapping) or not inputs:
        raise UsageError(
            f"inputs must be a numpy array or a mapping of input name to array, got {type(inputs).__name__}"
        )
    arrays = {str(name): _little_endian(value, str(name)) for name, value in inputs.items()}
    if all(tensor_header.NAME.match(n) and a.dtype.name in RAW_DTYPES for n, a in arrays.items()):
        headers["Content-Type"] = RAW
        headers[tensor_header.HEADER] = tensor_header.format_header((n, a.dtype, a.shape) for n, a in arrays.items())
        body = [_bytes_of(a) for a in arrays.values()]
    else:
        # A name or dtype the raw header cannot carry: .npz carries anything, and the agent
        # answers a dtype the model does not take with a 422 naming both.
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        headers["Content-Type"] = NPZ
        body = [buffer.getvalue()]
    return Call("POST", infer_path(model), headers, body, sum(len(p) for p in body))


class InferenceOutputs(dict[str, np.ndarray]):
    """The model's outputs by name; ``variant`` is the model variant that computed them."""

    variant: str

    def __init__(self, outputs: Mapping[str, np.ndarray], variant: str) -> None:
        super().__init__(outputs)
        self.variant = variant


def _parse_tensors(header: str, body: bytearray) -> dict[str, np.ndarray]:
    try:
        entries = tensor_header.parse_header(header)
    except ValueError as exc:
        raise AgentRequestError(f"the agent's answer: {exc}") from None
    outputs: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, shape, count in entries:
        size = count * dtype.itemsize
        if offset + size > len(body):
            raise AgentRequestError(f"the agent's answer has {len(body)} bytes; its X-Tensors needs {offset + size}")
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
        outputs[name] = array.astype(dtype.newbyteorder("="), copy=False)
        offset += size
    if offset != len(body):
        raise AgentRequestError(f"the agent's answer has {len(body)} bytes; its X-Tensors describes {offset}")
    return outputs


def decode_outputs(headers: Mapping[str, str], body: bytearray) -> InferenceOutputs:
    """A 200 answer of ``/infer`` → the outputs (writable arrays over ``body``)."""
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    variant = headers.get("x-model-variant", "")
    if content_type == RAW:
        return InferenceOutputs(_parse_tensors(headers.get("x-tensors", ""), body), variant)
    if content_type == NPZ:
        with np.load(io.BytesIO(body), allow_pickle=False) as archive:
            return InferenceOutputs({name: archive[name] for name in archive.files}, variant)
    if content_type == JSON:
        document = json.loads(body)
        return InferenceOutputs({k: np.asarray(v) for k, v in document["outputs"].items()}, variant)
    raise AgentRequestError(f"the agent answered in {content_type!r}, which this client does not read")


def json_body(body: bytearray, url: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise AgentRequestError(f"{url}: the agent's answer is not JSON ({exc})", url=url) from exc


def _detail(body: bytearray) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        return bytes(body[:300]).decode("utf-8", "replace").strip()
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return document["error"]
    return json.dumps(document)[:300]


def raise_for_status(method: str, url: str, status: int, headers: Mapping[str, str], body: bytearray) -> None:
    """A 4xx/5xx answer → the typed error naming the status and the agent's own message."""
    if status < 400:
        return
    detail = _detail(body)
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "error"
    message = f"{method} {url}: {status} {reason}: {detail}"
    if status in (400, 413, 422):
        raise AgentInputError(message, status=status, detail=detail, url=url)
    if status == 404:
        raise AgentNotFoundError(message, status=status, detail=detail, url=url)
    if status == 503:
        retry = headers.get("retry-after", "")
        retry_after = float(retry) if retry.replace(".", "", 1).isdigit() else None
        raise AgentUnavailableError(message, status=status, detail=detail, url=url, retry_after=retry_after)
    if status in (408, 504):
        raise AgentTimeoutError(message, status=status, detail=detail, url=url)
    raise AgentRequestError(message, status=status, detail=detail, url=url)


#: What a transport returns for one call: status, lower-case headers, body.
Answer = tuple[int, dict[str, str], bytearray]


def read_json(where: Endpoint, call: Call, answer: Answer, also_ok: tuple[int, ...] = ()) -> Any:
    """A JSON answer's document; a 4xx/5xx (other than ``also_ok``) is its typed error."""
    status, headers, body = answer
    url = where.url(call.path)
    if status not in also_ok:
        raise_for_status(call.method, url, status, headers, body)
    return json_body(body, url)


def read_text(where: Endpoint, call: Call, answer: Answer) -> str:
    status, headers, body = answer
    raise_for_status(call.method, where.url(call.path), status, headers, body)
    return body.decode("utf-8")


def read_outputs(where: Endpoint, call: Call, answer: Answer) -> InferenceOutputs:
    """An ``/infer`` answer's outputs (writable arrays over the body)."""
    status, headers, body = answer
    raise_for_status(call.method, where.url(call.path), status, headers, body)
    return decode_outputs(headers, body)


def not_ready(where: Endpoint, timeout: float, last: str) -> AgentTimeoutError:
    """``wait_ready``'s error: no model loaded within ``timeout`` (``last``: what it said)."""
    url = where.url("/readyz")
    return AgentTimeoutError(f"{url}: not ready within {timeout:g} s ({last})", url=url)


#: Leading bytes → the media type ``/predict`` is sent as.
_IMAGE_MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"))


def predict_call(model: str, data: str | Path | bytes | Mapping[str, Any]) -> Call:
    """The request that runs ``model``'s bundled pipeline on one input: a JPEG, PNG or WAV (a
    path or its bytes), or a text pipeline's JSON (``{"text": "..."}``, a mapping)."""
    if isinstance(data, Mapping):
        body = json.dumps(dict(data), ensure_ascii=False).encode()
        media: str | None = "application/json"
    else:
        raw = data if isinstance(data, (bytes, bytearray, memoryview)) else _read_image(Path(data))
        body = bytes(raw)
        media = _media_of(body)
    if media is None:
        raise UsageError(
            f'predict takes a JPEG, PNG or WAV file, or {{"text": ...}}; these {len(body)} bytes are none of them'
        )
    headers = {"Content-Type": media, "Accept": "application/json, image/png"}
    return Call("POST", f"/v1/models/{quote(model, safe='')}/predict", headers, [body], len(body))


def _media_of(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    return next((kind for magic, kind in _IMAGE_MAGIC if data.startswith(magic)), None)


def _read_image(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_prediction(where: Endpoint, call: Call, answer: Answer) -> dict[str, Any] | bytes:
    """A 200 of ``/predict``: the JSON result (``{"labels": [...]}``), or a mask's PNG bytes."""
    status, headers, body = answer
    raise_for_status(call.method, where.url(call.path), status, headers, body)
    if headers.get("content-type", "").startswith("image/png"):
        return bytes(body)
    return json_body(body, where.url(call.path))  # type: ignore[no-any-return]
