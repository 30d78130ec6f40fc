"""``AsyncAgentClient``: the device agent's local API from asyncio code.

On asyncio streams (``open_connection`` / ``open_unix_connection``) and a small HTTP/1.1
reader for the agent's answers, which always carry ``Content-Length``; no third-party
package. Connections are kept alive and pooled, so concurrent ``infer`` calls
(``asyncio.gather``) each use their own connection. A client belongs to the event loop
that first used it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgesdk.client import wire
from edgesdk.client.wire import Answer, ArrayInputs, Call, Endpoint, InferenceOutputs
from edgesdk.errors import AgentConnectionError, AgentRequestError, AgentTimeoutError, AgentUnavailableError

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Stale(AgentConnectionError):
    """A kept-alive connection was closed by the agent before it read the request.

    Internal: caught in this module, which then retries once on a fresh connection."""


class AsyncAgentClient:
    """The async twin of :class:`edgesdk.AgentClient`: same methods, awaited, same errors.

    ``async with AsyncAgentClient("http://127.0.0.1:8470") as agent: await agent.infer(...)``,
    or ``AsyncAgentClient(unix_socket="/run/edgesdk/agent.sock")``. ``timeout`` (seconds)
    bounds each request from connecting to the last byte of the answer."""

    def __init__(self, url: str | None = None, *, unix_socket: str | Path | None = None, timeout: float = 30.0) -> None:
        self.endpoint: Endpoint = wire.endpoint(url, unix_socket)
        self.timeout = timeout
        self._idle: list[_Stream] = []

    def __repr__(self) -> str:
        return f"AsyncAgentClient({self.endpoint.url('')!r})"

    # -- routes -----------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return await self._get_json("/healthz")  # type: ignore[no-any-return]

    async def ready(self) -> dict[str, Any]:
        """``GET /readyz``: ``{"ready": True, ...}`` or ``{"ready": False, "reason"}``."""
        return await self._get_json("/readyz", also_ok=(503,))  # type: ignore[no-any-return]

    async def status(self) -> dict[str, Any]:
        """``GET /v1/status``."""
        return await self._get_json("/v1/status")  # type: ignore[no-any-return]

    async def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: each served model with its variants and I/O signature."""
        return (await self._get_json("/v1/models"))["models"]  # type: ignore[no-any-return]

    async def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        call = wire.get_call("/metrics")
        return wire.read_text(self.endpoint, call, await self._send(call))

    async def infer(self, model: str, inputs: ArrayInputs) -> InferenceOutputs:
        """Run ``model`` on ``inputs`` (one array, or arrays by input name); outputs by name."""
        call = wire.infer_call(model, inputs)
        return wire.read_outputs(self.endpoint, call, await self._send(call))

    async def predict(self, model: str, data: str | Path | bytes | Mapping[str, Any]) -> dict[str, Any] | bytes:
        """``model``'s bundled pipeline on one JPEG, PNG, WAV or ``{"text": ...}``: the task result, or a mask's PNG."""
        call = wire.predict_call(model, data)
        return wire.read_prediction(self.endpoint, call, await self._send(call))

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> dict[str, Any]:
        """Poll ``/readyz`` until a model is loaded (the agent may still be starting)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = "no answer yet"
        while True:
            try:
                answer = await self.ready()
                if answer.get("ready"):
                    return answer
                last = str(answer.get("reason", answer))
            except (AgentConnectionError, AgentUnavailableError) as exc:
                last = str(exc)
            if loop.time() >= deadline:
                raise wire.not_ready(self.endpoint, timeout, last)
            await asyncio.sleep(interval)

    # -- transport ------------------------------------------------------------------------------

    async def _get_json(self, path: str, also_ok: tuple[int, ...] = ()) -> Any:
        call = wire.get_call(path)
        return wire.read_json(self.endpoint, call, await self._send(call), also_ok)

    async def _open(self) -> _Stream:
        if self.endpoint.unix_socket:
            return await asyncio.open_unix_connection(self.endpoint.unix_socket)
        return await asyncio.open_connection(self.endpoint.host, self.endpoint.port)

    async def _send(self, call: Call) -> Answer:
        url = self.endpoint.url(call.path)
        try:
            return await asyncio.wait_for(self._send_once_or_twice(call), self.timeout)
        except asyncio.TimeoutError as exc:
            raise AgentTimeoutError(f"{call.method} {url}: no answer within {self.timeout:g} s", url=url) from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise AgentConnectionError(f"{call.method} {url}: cannot reach the agent ({exc})", url=url) from exc

    async def _send_once_or_twice(self, call: Call) -> Answer:
        if self._idle:
            try:
                return await self._exchange(self._idle.pop(), call, reused=True)
            except _Stale:
                pass  # the agent closed the idle connection first: one retry on a fresh one, below
        return await self._exchange(await self._open(), call, reused=False)

    async def _exchange(self, stream: _Stream, call: Call, *, reused: bool) -> Answer:
        reader, writer = stream
        try:
            lines = [f"{call.method} {self.endpoint.prefix}{call.path} HTTP/1.1", "Host: localhost"]
            lines += [f"{name}: {value}" for name, value in call.headers.items()]
            if call.method == "POST":
                lines.append(f"Content-Length: {call.length}")
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            for part in call.body:
                writer.write(part)
            try:
                await writer.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the agent may have answered before reading it all (413): read that answer
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
                if reused and not getattr(exc, "partial", b""):
                    raise _Stale("the agent closed this kept-alive connection before reading the request") from exc
                raise
            status, headers = _parse_head(head)
            length = headers.get("content-length")
            if length is not None:
                body = bytearray(await reader.readexactly(int(length)))
            elif "transfer-encoding" in headers:
                raise AgentRequestError(f"the agent answered with Transfer-Encoding {headers['transfer-encoding']!r}")
            else:
                body = bytearray(await reader.read())  # delimited by the close
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close" or length is None:
            writer.close()
        else:
            self._idle.append(stream)
        return status, headers, body

    async def aclose(self) -> None:
        """Close the kept-alive connections."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            try:
                await writer.wait_closed()
            except OSError:
                pass  # already reset by the agent: closed either way

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise AgentRequestError(f"the agent's answer does not start with an HTTP status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
