"""Python bytecodes per tiny-model request, the agent against the raw peer (issue 15,
BENCHMARKS.md "Eighth session"): one request each, fed through ``data_received`` in process as
``probe_api_in_process.py`` feeds them (the agent's prepared route answering), traced with
``sys.settrace`` opcode events; printed per Python function (``--lines``: per source line).
Deterministic: a count, not a timing.

    .venv/bin/python benchmarks/probe_bytecodes.py [--body json|raw] [--lines]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body", choices=["json", "raw"], default="json")
    parser.add_argument("--lines", action="store_true", help="count per source line")
    args = parser.parse_args()
    import uvloop
    from _fair_peers import RawProtocol, make_work
    from edgesdk.agent.api.app import ApiApp
    from edgesdk.agent.api.http import HttpLimits, HttpProtocol, HttpServer
    from edgesdk.agent.api.prepared import PreparedInfer
    from edgesdk.agent.metrics import Metrics
    from probe_prepared_route import FakeTransport, digits_served

    from edgesdk.schemas.agent_config import ApiConfig

    digits, x, loaded, server, stats = digits_served()
    name = loaded.inputs[0].name
    dims = ",".join(map(str, x.shape))
    body, headers = {
        "json": (json.dumps({"inputs": {name: x.tolist()}}).encode(), "Content-Type: application/json\r\n"),
        "raw": (x.tobytes(), f"Content-Type: application/x-edgesdk-tensors\r\nX-Tensors: {name}=float32[{dims}]\r\n"),
    }[args.body]

    def request(path: str) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )

    opcodes: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        key = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
        if args.lines:
            key += f":{frame.f_lineno}"
        if event == "call":
            calls[key] += 1
        elif event == "opcode":
            opcodes[key] += 1
        return tracer

    async def warmed(protocol: Any, data: bytes) -> tuple[Any, bytes]:
        protocol.connection_made(FakeTransport())
        for _ in range(30):  # the first answers go through the pool; then the route is prepared
            protocol.data_received(data)
            await asyncio.sleep(0.002)
        return protocol, data

    async def run() -> None:
        RawProtocol.work = staticmethod(make_work(str(digits.onnx), threads=1, spinning=False))  # type: ignore[assignment]
        app = ApiApp(server, Metrics(server, stats=stats), ApiConfig())
        app.loop = asyncio.get_running_loop()
        http = HttpServer(app.handle, HttpLimits())
        cases = {
            "agent": await warmed(HttpProtocol(app.handle, http.limits, http), request("/v1/models/digits/infer")),
            "raw peer": await warmed(RawProtocol(), request("/infer")),
        }
        (known,) = http.known_heads.values()
        if not isinstance(known.route, PreparedInfer):
            raise SystemExit("the agent prepared no route for the request")
        for label, (protocol, data) in cases.items():
            opcodes.clear()
            calls.clear()
            sys.settrace(tracer)
            protocol.data_received(data)
            sys.settrace(None)
            print(f"\n{label}, {args.body} body: {sum(opcodes.values())} bytecodes, {sum(calls.values())} Python calls")
            for key, count in opcodes.most_common():
                print(f"  {count:5d}  {key}")

    uvloop.run(run())


if __name__ == "__main__":
    main()
