"""Microseconds per request in process, no sockets: where the agent's tiny-JSON answer differs
from the raw peer's (issue 15, BENCHMARKS.md "Sixth session").

The digits CNN (one onnxruntime session, one intra-op thread) answered by the agent's HTTP layer
and API (``HttpProtocol`` + ``ApiApp``, as served: from the third request a route prepared for
the header block) and by the raw uvloop + httptools peer of bench_api.py
(``_fair_peers.RawProtocol``), each fed the same request bytes through ``data_received`` with a
transport that only counts writes. Three more agents answer JSON with a piece of the peer's
code put in their plan: its decode (``np.asarray(orjson.loads(body)[...], float32)``, no
checks, no memory charge), its encode (``{"outputs": ...}``, no model/version/variant), both.
Every case runs ``--batch`` requests in turn, ``--rounds`` times; the best per case is printed
(a slow spell of this shared machine hits every case, not the one that ran through it).

    .venv/bin/python benchmarks/probe_api_in_process.py [--rounds 40] [--batch 300]

What it cannot show: the kernel's side of a real socket, and the caches a real client and
network stack share with the server (bench_api.py with wrk measures those).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=300, help="requests per case and round")
    args = parser.parse_args()
    import numpy as np
    import orjson
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
    bodies = {
        # As bench_api.py sends them.
        "json": (json.dumps({"inputs": {name: x.tolist()}}).encode(), "Content-Type: application/json\r\n"),
        "raw": (
            x.tobytes(),
            f"Content-Type: application/x-edgesdk-tensors\r\nX-Tensors: {name}=float32[{dims}]\r\n",
        ),
    }

    def request(path: str, body_name: str) -> bytes:
        body, headers = bodies[body_name]
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
        return head.encode() + body

    def peer_decode(plan: PreparedInfer) -> None:
        plan.decode = lambda body, allowance: {name: np.asarray(orjson.loads(body)["inputs"][name], np.float32)}

    def peer_encode(plan: PreparedInfer) -> None:
        plan.encode = lambda outputs, variant: (
            orjson.dumps({"outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY),
            "",
        )

    def peer_both(plan: PreparedInfer) -> None:
        peer_decode(plan)
        peer_encode(plan)

    async def warmed(protocol: Any, data: bytes) -> tuple[Any, bytes]:
        protocol.connection_made(FakeTransport())
        for _ in range(30):  # the first answers go through the pool: let them come back
            protocol.data_received(data)
            await asyncio.sleep(0.002)
        return protocol, data

    async def agent(body_name: str, patch: Callable[[PreparedInfer], None] | None = None) -> tuple[Any, bytes]:
        app = ApiApp(server, Metrics(server, stats=stats), ApiConfig())
        app.loop = asyncio.get_running_loop()
        http = HttpServer(app.handle, HttpLimits())
        case = await warmed(HttpProtocol(app.handle, http.limits, http), request("/v1/models/digits/infer", body_name))
        (known,) = http.known_heads.values()
        if not isinstance(known.route, PreparedInfer):
            raise SystemExit(f"agent, {body_name}: no prepared route after 30 requests")
        if patch is not None:
            patch(known.route)
        return case

    async def run() -> None:
        RawProtocol.work = staticmethod(make_work(str(digits.onnx), threads=1, spinning=False))  # type: ignore[assignment]
        cases = {
            "agent, JSON": await agent("json"),
            "raw peer, JSON": await warmed(RawProtocol(), request("/infer", "json")),
            "agent, raw body": await agent("raw"),
            "raw peer, raw body": await warmed(RawProtocol(), request("/infer", "raw")),
            "agent, JSON, the peer's decode": await agent("json", peer_decode),
            "agent, JSON, the peer's encode": await agent("json", peer_encode),
            "agent, JSON, the peer's decode and encode": await agent("json", peer_both),
        }
        best = dict.fromkeys(cases, float("inf"))
        for _ in range(args.rounds):
            for label, (protocol, data) in cases.items():
                start = time.perf_counter()
                for _ in range(args.batch):
                    protocol.data_received(data)
                best[label] = min(best[label], (time.perf_counter() - start) / args.batch)
        for label, (protocol, _) in cases.items():
            if protocol.transport.writes != 30 + args.rounds * args.batch:
                raise SystemExit(f"{label}: {protocol.transport.writes} answers")
        print(
            f"best of {args.rounds} rounds of {args.batch} requests per case\n\n| case | µs per request |\n| --- | ---: |"
        )
        for label, seconds in best.items():
            print(f"| {label} | {seconds * 1e6:.1f} |")

    uvloop.run(run())


if __name__ == "__main__":
    main()
