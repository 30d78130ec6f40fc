"""``AgentClient``: the device agent's local API from ordinary (blocking) Python code.

Built on the standard library's ``http.client`` so an application on the device needs nothing
beyond numpy (httpx is only a development dependency of edgesdk); a Unix socket is a
connection class whose ``connect`` opens an ``AF_UNIX`` socket. Connections are kept alive
and pooled, so the client can be shared between threads and each thread gets a connection.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgesdk.client import wire
from edgesdk.client.wire import Answer, ArrayInputs, Call, Endpoint, InferenceOutputs
from edgesdk.errors import AgentConnectionError, AgentTimeoutError, AgentUnavailableError

# A kept-alive connection the agent has closed meanwhile (idle timeout, restart) fails at
# once with one of these, before the agent saw the request: worth one retry on a new one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.CannotSendRequest)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (the agent's ``api.unix_socket``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentClient:
    """A client for a device agent's local API (``edge-agent run``).

    ``AgentClient("http://127.0.0.1:8470")`` or ``AgentClient(unix_socket="/run/edgesdk/agent.sock")``;
    ``timeout`` (seconds) bounds connecting and each wait for the agent. Use it as a context
    manager, or call :meth:`close`. Errors are :class:`~edgesdk.errors.AgentRequestError`
    subclasses: :class:`~edgesdk.errors.AgentInputError` (400/413/422),
    :class:`~edgesdk.errors.AgentNotFoundError` (404),
    :class:`~edgesdk.errors.AgentUnavailableError` (503, with ``retry_after``),
    :class:`~edgesdk.errors.AgentTimeoutError` (504 or no answer in time) and
    :class:`~edgesdk.errors.AgentConnectionError` (nothing listening, connection broken).
    """

    def __init__(self, url: str | None = None, *, unix_socket: str | Path | None = None, timeout: float = 30.0) -> None:
        self.endpoint: Endpoint = wire.endpoint(url, unix_socket)
        self.timeout = timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AgentClient({self.endpoint.url('')!r})"

    # -- routes -----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok"}`` while the agent's process serves."""
        return self._get_json("/healthz")  # type: ignore[no-any-return]

    def ready(self) -> dict[str, Any]:
        """``GET /readyz``: ``{"ready": True, "model", "variant"}``, or ``{"ready": False, "reason"}``."""
        return self._get_json("/readyz", also_ok=(503,))  # type: ignore[no-any-return]

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: device, model, active variant, governor, sensors, store slots, problems."""
        return self._get_json("/v1/status")  # type: ignore[no-any-return]

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: each served model with its variants and I/O signature."""
        return self._get_json("/v1/models")["models"]  # type: ignore[no-any-return]

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        call = wire.get_call("/metrics")
        return wire.read_text(self.endpoint, call, self._send(call))

    def infer(self, model: str, inputs: ArrayInputs) -> InferenceOutputs:
        """Run ``model`` on ``inputs`` and return its outputs by name (numpy arrays).

        ``inputs``: one array for a one-input model, or a mapping of input name to array, with
        the dtypes and shapes of the model's signature (``models()`` shows it). The result is
        a dict whose ``variant`` attribute names the variant that answered."""
        call = wire.infer_call(model, inputs)
        return wire.read_outputs(self.endpoint, call, self._send(call))

    def predict(self, model: str, data: str | Path | bytes | Mapping[str, Any]) -> dict[str, Any] | bytes:
        """Run ``model``'s bundled pipeline on one input: a JPEG, PNG or WAV (a path or its bytes)
        or ``{"text": "..."}``. The task result (``{"labels": [...]}``, ``{"boxes": [...]}``,
        ``{"text": ...}``, ``{"embedding": [...]}``, ...), or a mask's PNG bytes."""
        call = wire.predict_call(model, data)
        return wire.read_prediction(self.endpoint, call, self._send(call))

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> dict[str, Any]:
        """Poll ``/readyz`` until a model is loaded (the agent may still be starting)."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            try:
                answer = self.ready()
                if answer.get("ready"):
                    return answer
                last = str(answer.get("reason", answer))
            except (AgentConnectionError, AgentUnavailableError) as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise wire.not_ready(self.endpoint, timeout, last)
            time.sleep(interval)

    # -- transport ------------------------------------------------------------------------------

    def _get_json(self, path: str, also_ok: tuple[int, ...] = ()) -> Any:
        call = wire.get_call(path)
        return wire.read_json(self.endpoint, call, self._send(call), also_ok)

    def _connection(self) -> http.client.HTTPConnection:
        if self.endpoint.unix_socket:
            return _UnixConnection(self.endpoint.unix_socket, self.timeout)
        return http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=self.timeout)

    def _send(self, call: Call) -> Answer:
        with self._lock:
            reused = self._idle.pop() if self._idle else None
        url = self.endpoint.url(call.path)
        try:
            if reused is not None:
                try:
                    return self._exchange(reused, call)
                except _STALE:
                    reused.close()
            return self._exchange(self._connection(), call)
        except TimeoutError as exc:
            raise AgentTimeoutError(f"{call.method} {url}: no answer within {self.timeout:g} s", url=url) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise AgentConnectionError(f"{call.method} {url}: cannot reach the agent ({exc})", url=url) from exc

    def _exchange(self, conn: http.client.HTTPConnection, call: Call) -> Answer:
        try:
            conn.putrequest(call.method, self.endpoint.prefix + call.path, skip_accept_encoding=True)
            for name, value in call.headers.items():
                conn.putheader(name, value)
            if call.method == "POST":
                conn.putheader("Content-Length", str(call.length))
            conn.endheaders()
            try:
                for part in call.body:  # the arrays' own memory; http.client sets TCP_NODELAY
                    conn.send(part)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the agent may have answered before reading it all (413): read that answer
            response = conn.getresponse()
            body = _read_body(response)
        except BaseException:
            conn.close()
            raise
        headers = {name.lower(): value for name, value in response.getheaders()}
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append(conn)
        return response.status, headers, body

    def close(self) -> None:
        """Close the kept-alive connections (the client can still be used; it reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_body(response: http.client.HTTPResponse) -> bytearray:
    """The whole body into one bytearray (arrays decoded over it are writable, not copied)."""
    if response.length is None:
        return bytearray(response.read())
    body = bytearray(response.length)
    view = memoryview(body)
    filled = 0
    while filled < len(body):
        count = response.readinto(view[filled:])
        if not count:
            raise http.client.IncompleteRead(bytes(view[:filled]), len(body) - filled)
        filled += count
    return body
