"""Every inference route, before and after a change: two agents from two checkouts side by side
(BENCHMARKS.md, "Local API vs fair peers"; issue 39).

    git worktree add /tmp/before <commit>; git worktree add /tmp/after <commit>
    .venv/bin/python benchmarks/bench_api_routes.py /tmp/before /tmp/after [--rounds 6] [--seconds 3]

Each agent runs its checkout's code (``--shim``: a sitecustomize folder that points the editable
install at ``EDGESDK_TREE``; /tmp/helpers/oldcode-shim in the helpers' sessions) with the digits
CNN and MobileNetV2 installed and gRPC on. Cells, one connection each: /v1 JSON and raw tensors
(a keep-alive client's prepared route), /v1 ``.npz`` (the generic route on a tiny model), /v2 JSON
and binary (wrk), MobileNetV2 ``.npy`` (the generic route through the pool), gRPC ``ModelInfer``
with raw contents (a Python client on one channel). Rounds interleave the two agents, alternating
which goes first; printed per cell: median requests/s, the median of the per-round ratios after ÷
before, and the CPU each agent process spent per answer (all its threads, from /proc), which
other processes' load moves far less than throughput.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_api  # noqa: E402
import numpy as np  # noqa: E402


def npz_body(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, image=x)
    return buffer.getvalue()


def v2_bodies(x: np.ndarray) -> dict[str, tuple[bytes, dict[str, str]]]:
    head = {"name": "image", "shape": list(x.shape), "datatype": "FP32"}
    plain = json.dumps({"inputs": [{**head, "data": x.ravel().tolist()}]}).encode()
    header = json.dumps(
        {"inputs": [{**head, "parameters": {"binary_data_size": x.nbytes}}], "parameters": {"binary_data_output": True}}
    ).encode()
    return {
        "v2-json": (plain, {"Content-Type": "application/json"}),
        "v2-binary": (
            header + x.astype("<f4").tobytes(),
            {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
        ),
    }


def grpc_run(port: int, message: bytes, seconds: float) -> int:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        call(message)
        answers, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            call(message)
            answers += 1
    return answers


def main() -> None:
    from tests.agent_helpers import AgentProcess, agent_env

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the checkout before the change")
    parser.add_argument("after", type=Path, help="the checkout after it")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell, agent and round")
    parser.add_argument("--shim", type=Path, default=Path("/tmp/helpers/oldcode-shim"))
    args = parser.parse_args()
    before, after, rounds, seconds = args.before.resolve(), args.after.resolve(), args.rounds, args.seconds
    work = Path(tempfile.mkdtemp(prefix="plans-bench-"))
    agents = {}
    models = {}
    for label, tree in (("before", before), ("after", after)):
        prepared = bench_api.prepare(work / label, ("digits", "mobilenet"), api={"grpc": {"enabled": True, "port": 0}})
        env = agent_env()
        env["PYTHONPATH"] = str(args.shim.resolve())
        env["EDGESDK_TREE"] = str(tree)
        agents[label] = {name: AgentProcess(m["device"], env=env).start() for name, m in prepared.items()}
        models = prepared
    from edgesdk.agent.api import open_inference_v2_pb2 as pb

    x = models["digits"]["x"]
    cells = []
    for name in ("json", "raw"):
        body, headers = bench_api.bodies(x)[name]
        cells.append((f"digits v1 {name} (prepared)", "digits", "/v1/models/digits/infer", body, headers))
    cells.append(
        (
            "digits v1 npz (generic)",
            "digits",
            "/v1/models/digits/infer",
            npz_body(x),
            {"Content-Type": "application/x-npz"},
        )
    )
    for name, (body, headers) in v2_bodies(x).items():
        cells.append((f"digits {name}", "digits", "/v2/models/digits/infer", body, headers))
    mx = models["mobilenet"]["x"]
    body, headers = bench_api.bodies(mx)["npy"]
    cells.append(("mobilenet v1 npy (generic)", "mobilenet", "/v1/models/mobilenet/infer", body, headers))
    message = pb.ModelInferRequest(model_name="digits")
    message.inputs.add(name="image", datatype="FP32", shape=x.shape)
    message.raw_input_contents.append(x.astype("<f4").tobytes())
    grpc_message = message.SerializeToString()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_index in range(rounds):
        order = ["before", "after"] if round_index % 2 == 0 else ["after", "before"]
        for cell, model, path, body, headers in cells + [("digits gRPC raw", "digits", None, b"", {})]:
            for label in order:
                agent = agents[label][model]
                pid = agent.proc.pid
                if path is None:
                    port = int((agent.device.data_dir / "grpc.port").read_text())
                    grpc_run(port, grpc_message, 0.5)
                    cpu = bench_api.process_cpu_s(pid)
                    started = time.monotonic()
                    answers = grpc_run(port, grpc_message, seconds)
                    rps = answers / (time.monotonic() - started)
                else:
                    slug = "".join(c if c.isalnum() else "-" for c in cell)
                    script = bench_api.lua_script(work, f"{label}-{slug}", body, headers)
                    bench_api.run_wrk(agent.port, path, script, 1, 1)
                    cpu = bench_api.process_cpu_s(pid)
                    row = bench_api.run_wrk(agent.port, path, script, 1, seconds)
                    if row["failed"]:
                        raise RuntimeError(f"{label} {cell}: {row['failed']} failed")
                    answers, rps = row["answers"], row["rps"]
                used = bench_api.process_cpu_s(pid) - cpu
                results.setdefault((cell, label), []).append((rps, used / max(1, answers) * 1e6))
        print(f"round {round_index + 1}/{rounds} ({bench_api.load_average()})", flush=True)
    for group in agents.values():
        for agent in group.values():
            agent.stop()
    print(
        "\n| cell (c=1) | before req/s | after req/s | after ÷ before (median of rounds) | CPU µs/answer before / after |"
    )
    print("| --- | ---: | ---: | ---: | --- |")
    for cell, *_ in cells + [("digits gRPC raw",)]:
        b, a = results[(cell, "before")], results[(cell, "after")]
        ratio = statistics.median(ra[0] / rb[0] for ra, rb in zip(a, b, strict=True))
        print(
            f"| {cell} | {statistics.median(r[0] for r in b):,.0f} | {statistics.median(r[0] for r in a):,.0f} | {ratio:.3f} "
            f"| {statistics.median(r[1] for r in b):,.0f} / {statistics.median(r[1] for r in a):,.0f} |"
        )


if __name__ == "__main__":
    main()
