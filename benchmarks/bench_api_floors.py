"""How fast can any Python server answer the digits CNN at one connection? (issue 15's "≥ 2×
FastAPI for the tiny model at c=1" goal, BENCHMARKS.md, "Local API vs fair peers").

Beside the agent, the fair FastAPI peer and the raw uvloop + httptools peer (as
``bench_api.py`` runs them), bounds built from the raw peer (``_fair_peers.py --floor``):

``model floor``   httptools parses each request, the model runs (on the first request's input),
                  the first answer is sent again: no decode, no encode, no checks;
``+ decode``      (JSON only) the model floor, each JSON body read as the raw peer reads it (model run on it);
``+ encode``      (JSON only) the model floor, each JSON answer written as the raw peer writes it;
``answer floor``  the model floor without the model run: httptools and the event loop;
``echo floor``    no parsing either: each read is answered with the first response's bytes.

Any server that reads the body and runs the model does at least the model floor's work, so
``model floor ÷ FastAPI`` bounds what ``agent ÷ FastAPI`` can reach on this machine with uvloop.

    .venv/bin/python benchmarks/bench_api_floors.py --body json --rounds 6 --seconds 4

Rounds interleave the servers and rotate their order; printed: each server's medians (req/s,
CPU per answer of the server process, p50) and its per-round throughput ratio to FastAPI.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_api  # noqa: E402

FLOORS = {
    "model floor": "model",
    "+ decode": "decode",
    "+ encode": "encode",
    "answer floor": "answer",
    "echo floor": "echo",
}
JSON_ONLY = ("decode", "encode")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body", choices=["json", "npy", "raw"], default="json")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, help="onnxruntime intra-op threads for every server (default: what the agent chooses)"
    )
    args = parser.parse_args()
    from tests.agent_helpers import AgentProcess

    work = Path(tempfile.mkdtemp(prefix="c1-floor-"))
    runtime = (args.threads, bench_api.agent_runtime_defaults()[1]) if args.threads else None
    model = bench_api.prepare(work, ("digits",), runtime)["digits"]
    agent = AgentProcess(model["device"]).start()
    servers: dict[str, tuple[int, str, int]] = {"agent": (agent.port, "/v1/models/digits/infer", agent.proc.pid)}
    # Every server runs the model with the intra-op threads the agent chose, as in bench_api.py.
    model = bench_api.matched_to_agent(model, bench_api.agent_threads(agent.port, "digits"))
    peers: list[subprocess.Popen[bytes]] = []
    floors = {name: floor for name, floor in FLOORS.items() if args.body == "json" or floor not in JSON_ONLY}
    for name, floor in {"fastapi": None, "raw": None, **floors}.items():
        peer_model: dict[str, Any] = (
            model if floor is None else {**model, "peer_mode": [*model["peer_mode"], "--floor", floor]}
        )
        proc, port = bench_api.start_peer("fastapi" if name == "fastapi" else "raw", peer_model)
        peers.append(proc)
        servers[name] = (port, "/infer", proc.pid)
    body, headers = bench_api.bodies(model["x"])[args.body]
    answers = {name: bench_api.post(port, path, body, headers) for name, (port, path, _) in servers.items()}
    for name, answer in answers.items():  # every server, the bounds included, answers the same logits
        if float(abs(answer - answers["raw"]).max()) > 1e-3:
            raise RuntimeError(f"{name} answers differently from the raw peer")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    try:
        for round_index in range(args.rounds):
            order = list(servers.items())
            shift = round_index % len(order)
            for name, (port, path, pid) in order[shift:] + order[:shift]:
                script = bench_api.lua_script(work, f"{name.replace(' ', '-')}-{args.body}", body, headers)
                bench_api.run_wrk(port, path, script, args.concurrency, 1)
                cpu = bench_api.process_cpu_s(pid)
                row = bench_api.run_wrk(port, path, script, args.concurrency, args.seconds)
                row["cpu_us"] = (bench_api.process_cpu_s(pid) - cpu) / max(1, row["answers"]) * 1e6
                rows[name].append(row)
            print(f"round {round_index + 1}/{args.rounds} ({bench_api.load_average()})", flush=True)
    finally:
        agent.stop()
        for proc in peers:
            proc.terminate()
            proc.wait(10)
    failed = {name: sum(r["failed"] for r in measured) for name, measured in rows.items()}
    print(
        f"\ndigits, {args.body} body, c={args.concurrency}, {args.rounds} rounds of {args.seconds} s, "
        f"intra-op threads {model['peer_mode'][1:]}; failed {failed}\n"
    )
    print("| server | req/s | µs per answer (1 / req/s) | CPU µs per answer | p50 ms | ÷ FastAPI (per-round median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, measured in rows.items():
        rps = statistics.median(m["rps"] for m in measured)
        ratio = statistics.median(m["rps"] / f["rps"] for m, f in zip(measured, rows["fastapi"], strict=True))
        print(
            f"| {name} | {rps:,.0f} | {1e6 / rps:.0f} | {statistics.median(m['cpu_us'] for m in measured):.0f} "
            f"| {statistics.median(m['p50_ms'] for m in measured):.3f} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
