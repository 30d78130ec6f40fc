"""How far a route prepared per known header block could take the agent (issue 15): instructions
per request in process, no sockets, for three handlers of the same raw-tensor request on the
digits CNN (one onnxruntime session, one intra-op thread, on every side):

* ``agent``: the agent's HTTP layer and its whole API path (ApiApp.handle, as served);
* ``lean``: the agent's HTTP layer (known header blocks, memory budget, timers) with a handler
  that keeps only what a prepared route would do per request: the body as an array, the NaN/Inf
  scan, the active variant's run, the latency histogram, the answer with its variant header;
* ``raw``: the minimal uvloop + httptools peer of bench_api.py (_fair_peers.RawProtocol).

Each is run under valgrind's callgrind twice, with ``--requests`` and three times as many; the
difference divided by the extra requests is the per-request count (start-up cancels out).

    .venv/bin/python benchmarks/probe_prepared_route.py [--requests 100]

A probe, not a feature: the lean handler skips the checks a prepared route would do once per
header block (route, model, encodings, declared shapes), so it bounded what such a route could
save before one existed. Since agent/api/prepared.py, the ``agent`` handler takes that route
itself from the second request on (bench_api_instructions.py counts it in real processes).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODES = ("agent", "lean", "raw")


class FakeTransport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, parts: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default


def digits_served() -> tuple[Any, Any, Any, Any, Any]:
    """(digits files, one input, the onnxruntime model with one intra-op thread, a ModelServer
    serving it as "digits", its InferenceStats): the agent's serving side without the daemon."""
    import numpy as np
    from edgesdk.agent.metrics import InferenceStats
    from edgesdk.agent.serving import ModelServer

    from edgesdk.offline import disable_vendor_telemetry
    from edgesdk.runtimes import load_model
    from edgesdk.schemas.manifest import Variant
    from edgesdk.workloads.digits import prepare_digits

    disable_vendor_telemetry()
    digits = prepare_digits(ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1")
    onnx = Path(digits.onnx).read_bytes()
    x = np.ascontiguousarray(np.load(digits.validation)["image"][:1], np.float32)
    loaded = load_model("onnxruntime", onnx, options={"intra_op_num_threads": "1"})
    meta = Variant(
        id="onnx-fp32",
        format="onnx",  # type: ignore[arg-type]
        precision="fp32",  # type: ignore[arg-type]
        runtime="onnxruntime",  # type: ignore[arg-type]
        payload="onnx-fp32",
        size=len(onnx),
        sha256="0" * 64,
        encrypted_size=len(onnx),
        encrypted_sha256="0" * 64,
        inputs=loaded.inputs,
        outputs=loaded.outputs,
    )
    stats = InferenceStats()
    server = ModelServer(observe=stats.observe, count_error=stats.count_error)
    server.serve(name="digits", version="1.0.0", release=1, variants=[(meta, loaded)])
    return digits, x, loaded, server, stats


def serve(mode: str, requests: int) -> None:
    """Answer ``requests`` identical requests with ``mode``'s handler (after a warm-up)."""
    import numpy as np
    import uvloop
    from _fair_peers import RawProtocol, make_work
    from edgesdk.agent.api.app import ApiApp
    from edgesdk.agent.api.http import HttpLimits, HttpProtocol, HttpServer, Request, Respond, Response
    from edgesdk.agent.metrics import Metrics

    from edgesdk.schemas.agent_config import ApiConfig

    digits, x, loaded, server, stats = digits_served()
    input_name, output_names = loaded.inputs[0].name, [o.name for o in loaded.outputs]
    dims = ",".join(map(str, x.shape))
    body = x.tobytes()
    head = (
        f"POST {{path}} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-edgesdk-tensors\r\n"
        f"X-Tensors: {input_name}=float32[{dims}]\r\nContent-Length: {len(body)}\r\n\r\n"
    )

    def lean(request: Request, respond: Respond) -> None:
        array = np.frombuffer(request.body, np.float32, x.size, 0).reshape(x.shape)
        if not math.isfinite(np.vdot(array, array)):
            raise ValueError("NaN or Inf")
        variant = server._model.active  # type: ignore[union-attr]
        start = time.perf_counter()
        out = variant.loaded._run(output_names, {input_name: array}, None)[0]  # type: ignore[attr-defined]
        server.observe(variant.id, time.perf_counter() - start)
        headers = [("X-Tensors", f"{output_names[0]}=float32[1,10]"), ("X-Model-Variant", variant.id)]
        respond(Response(200, out.tobytes(), "application/x-edgesdk-tensors", headers))

    async def main() -> None:
        protocol: Any
        if mode == "raw":
            RawProtocol.work = staticmethod(make_work(str(digits.onnx), threads=1, spinning=False))  # type: ignore[assignment]
            protocol, path = RawProtocol(), "/infer"
        else:
            # inline_max_ms: answered on the loop as in the agent, however slow valgrind makes the run.
            app = ApiApp(server, Metrics(server, stats=stats), ApiConfig(inline_max_ms=1e6))
            app.loop = asyncio.get_running_loop()
            handler = lean if mode == "lean" else app.handle
            http = HttpServer(handler, HttpLimits())
            protocol, path = HttpProtocol(handler, http.limits, http), "/v1/models/digits/infer"
        data = head.format(path=path).encode() + body
        transport = FakeTransport()
        protocol.connection_made(transport)
        for _ in range(30):  # the first answers go through the pool: let them come back
            protocol.data_received(data)
            await asyncio.sleep(0.002)
        for _ in range(requests):
            protocol.data_received(data)
        if transport.writes != 30 + requests:
            raise SystemExit(f"{mode}: {transport.writes} answers to {30 + requests} requests")

    uvloop.run(main())


def collected(mode: str, requests: int) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    proc = subprocess.run(
        [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--serve", mode]
        + ["--requests", str(requests)],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise SystemExit(f"callgrind printed no total:\n{proc.stderr[-2000:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.requests)
        return
    per_request = {}
    for mode in MODES:
        few, many = collected(mode, args.requests), collected(mode, 3 * args.requests)
        per_request[mode] = (many - few) / (2 * args.requests)
        print(f"{mode}: {per_request[mode]:,.0f} instructions per request", flush=True)
    print("\n| handler | instructions per request | ÷ raw peer |\n|---|---:|---:|")
    for mode, count in per_request.items():
        print(f"| {mode} | {count:,.0f} | {count / per_request['raw']:.2f} |")


if __name__ == "__main__":
    main()
