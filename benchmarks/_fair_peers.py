"""The fair peers benchmarks/bench_api.py measures the agent against, written the way a
performance-minded developer would serve one ONNX model (TOOLCHAIN_NOTES "Fair serving baselines"):

``fastapi``
    FastAPI, an ``async def`` endpoint reading ``await request.body()``, on
    ``uvicorn --loop uvloop --http httptools``, access log off, orjson for JSON.
``raw``
    A minimal ``asyncio.Protocol`` + httptools server on uvloop (no framework at all).

Both: one onnxruntime session created at start (default session options unless
``--threads``/``--spinning`` say otherwise; bench_api.py gives every server the same); ``--inline`` runs the model on the event loop (tiny models),
``--pool N`` in a thread pool of N workers (large ones; N = the agent's ``max_concurrency``).
Bodies, as the agent speaks them: JSON ``{"inputs": {"image": [...]}}`` answered
``{"outputs": {"logits": [...]}}`` (float32 kept by orjson), ``.npy`` answered ``.npy``, raw
little-endian float32 with an ``X-Tensors`` header answered the same way.

Run as ``python _fair_peers.py fastapi|raw MODEL.onnx PORT (--inline | --pool N) [--threads N] [--spinning on|off]
[--json orjson|simdjson] [--floor model|decode|encode|answer|echo]``.

``--floor`` (raw only) makes the server a bound, not a peer (``bench_api_floors.py``): ``model``
runs the model on the first request's input for every request and sends its first answer again
(no decode, no encode); ``decode`` also reads each JSON body and runs the model on it,
``encode`` also writes each JSON answer (the model floor plus one of the two); ``answer`` sends the first answer without running anything (httptools and
the event loop alone); ``echo`` does not even parse: every read is answered with the first
answer's whole response (valid for a client that sends one request per read and waits, as wrk
at one connection does).
"""

# No `from __future__ import annotations`: FastAPI must see the real `Request` class
# (imported inside fastapi_app) in the endpoint signature.

import argparse
import asyncio
import io
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson

_SHAPE = re.compile(r"\[([0-9,\s]*)\]")
Answer = tuple[bytes, str, list[tuple[str, str]]]


def make_work(
    model_path: str,
    threads: int | None = None,
    spinning: bool | None = None,
    json_parser: str = "orjson",
    floor: str | None = None,
) -> Callable[[str, bytes, str], Answer]:
    """(content type, body, X-Tensors) → (body, content type, extra headers). ``threads`` and
    ``spinning`` set onnxruntime's intra-op threads and their spin-wait (None: its default), as
    bench_api.py sets them for the agent too. ``json_parser``: ``orjson`` (the recipe the issue
    names), or ``simdjson``: the input's numbers copied by pysimdjson into one float64 buffer,
    reshaped to the model's input shape (what the agent does, minus its checks). ``floor``: see
    ``--floor`` (the module's doc)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    input_shape = tuple(d if isinstance(d, int) else -1 for d in session.get_inputs()[0].shape)
    output_name = session.get_outputs()[0].name
    if json_parser == "simdjson":
        import simdjson

    def read_json(body: bytes) -> np.ndarray:
        if json_parser == "simdjson":
            numbers = simdjson.Parser().parse(body)["inputs"][input_name].as_buffer(of_type="d")
            return np.frombuffer(numbers, np.float64).astype(np.float32).reshape(input_shape)
        return np.asarray(orjson.loads(body)["inputs"][input_name], dtype=np.float32)

    first: list[Any] = []  # --floor: the first request's input and answer

    def recording_run(names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not first:
            first.append(feeds)
        return session.run(names, feeds)  # type: ignore[no-any-return]

    run = session.run if floor is None else recording_run

    def work(content_type: str, body: bytes, x_tensors: str) -> Answer:
        if content_type.startswith("application/x-npy"):
            (out,) = run([output_name], {input_name: np.load(io.BytesIO(body), allow_pickle=False)})
            buffer = io.BytesIO()
            np.save(buffer, out, allow_pickle=False)
            return buffer.getvalue(), "application/x-npy", []
        if content_type.startswith("application/x-edgesdk-tensors"):
            match = _SHAPE.search(x_tensors)
            shape = tuple(int(d) for d in match.group(1).split(",")) if match else (-1,)
            (out,) = run([output_name], {input_name: np.frombuffer(body, np.float32).reshape(shape)})
            dims = ",".join(str(d) for d in out.shape)
            return out.tobytes(), "application/x-edgesdk-tensors", [("X-Tensors", f"{output_name}=float32[{dims}]")]
        (out,) = run([output_name], {input_name: read_json(body)})
        return orjson.dumps({"outputs": {output_name: out}}, option=orjson.OPT_SERIALIZE_NUMPY), "application/json", []

    if floor is None:
        return work
    answered: list[Answer] = []

    def bound(content_type: str, body: bytes, x_tensors: str) -> Answer:
        if not answered:
            answered.append(work(content_type, body, x_tensors))
        elif floor == "model":
            session.run([output_name], first[0])
        elif floor == "decode":  # JSON bodies: read each one, as work does
            session.run([output_name], {input_name: read_json(body)})
        elif floor == "encode":  # JSON answers: written for each run, as work does
            (out,) = session.run([output_name], first[0])
            return (
                orjson.dumps({"outputs": {output_name: out}}, option=orjson.OPT_SERIALIZE_NUMPY),
                "application/json",
                [],
            )
        return answered[0]

    return bound


def fastapi_app(work: Callable[[str, bytes, str], Answer], pool: ThreadPoolExecutor | None):  # type: ignore[no-untyped-def]
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    app = FastAPI()

    @app.post("/infer")
    async def infer(request: Request) -> Response:
        body = await request.body()
        args = (request.headers.get("content-type", ""), body, request.headers.get("x-tensors", ""))
        if pool is None:
            content, media_type, headers = work(*args)
        else:
            content, media_type, headers = await asyncio.get_running_loop().run_in_executor(pool, work, *args)
        return Response(content, media_type=media_type, headers=dict(headers))

    return app


class RawProtocol(asyncio.Protocol):
    """One keep-alive connection: httptools callbacks collect a request, the model answers it."""

    work: Callable[[str, bytes, str], Answer]
    pool: ThreadPoolExecutor | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        import httptools

        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.loop = asyncio.get_running_loop()
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        args = (
            self.headers.get(b"content-type", b"").decode(),
            b"".join(self.body),
            self.headers.get(b"x-tensors", b"").decode(),
        )
        if self.pool is None:
            self.send(self.work(*args), keep_alive)
        else:
            future = self.loop.run_in_executor(self.pool, self.work, *args)
            future.add_done_callback(lambda f: self.send(f.result(), keep_alive))

    def send(self, answer: Answer, keep_alive: bool) -> None:
        content, media_type, headers = answer
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nContent-Length: {len(content)}\r\n{extra}"
        head += "\r\n" if keep_alive else "Connection: close\r\n\r\n"
        self.transport.write(head.encode() + content)
        if not keep_alive:
            self.transport.close()


class EchoProtocol(RawProtocol):
    """``--floor echo``: the first request is parsed and answered as RawProtocol does; every
    read after it gets that whole response again, unparsed (the event loop's floor)."""

    response = b""

    def data_received(self, data: bytes) -> None:
        if EchoProtocol.response:
            self.transport.write(EchoProtocol.response)
        else:
            super().data_received(data)

    def send(self, answer: Answer, keep_alive: bool) -> None:
        content, media_type, headers = answer
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nContent-Length: {len(content)}\r\n{extra}\r\n"
        EchoProtocol.response = head.encode() + content
        self.transport.write(EchoProtocol.response)


async def serve_raw(port: int, protocol: type[RawProtocol] = RawProtocol) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["fastapi", "raw"])
    parser.add_argument("model")
    parser.add_argument("port", type=int)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--inline", action="store_true", help="run the model on the event loop")
    mode.add_argument("--pool", type=int, help="run the model in a thread pool of this many workers")
    parser.add_argument("--threads", type=int, help="onnxruntime intra_op_num_threads (default: its own)")
    parser.add_argument("--spinning", choices=["on", "off"], help="onnxruntime intra-op spin-wait (default: its own)")
    parser.add_argument("--json", choices=["orjson", "simdjson"], default="orjson", help="how JSON bodies are read")
    parser.add_argument(
        "--floor",
        choices=["model", "decode", "encode", "answer", "echo"],
        help="raw only: a bound, not a peer (see module)",
    )
    args = parser.parse_args()
    if args.floor and (args.kind != "raw" or args.pool):
        parser.error("--floor is for the raw server with --inline")
    floor = "answer" if args.floor == "echo" else args.floor
    work = make_work(
        args.model, args.threads, None if args.spinning is None else args.spinning == "on", args.json, floor
    )
    pool = ThreadPoolExecutor(max_workers=args.pool) if args.pool else None
    if args.kind == "fastapi":
        import uvicorn

        uvicorn.run(
            fastapi_app(work, pool),
            host="127.0.0.1",
            port=args.port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
        )
    else:
        import uvloop

        RawProtocol.work = staticmethod(work)  # type: ignore[assignment]
        RawProtocol.pool = pool
        uvloop.run(serve_raw(args.port, EchoProtocol if args.floor == "echo" else RawProtocol))


if __name__ == "__main__":
    main()
