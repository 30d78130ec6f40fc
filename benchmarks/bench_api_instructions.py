"""Instructions per request: the agent vs the fair peers, counted by valgrind (BENCHMARKS.md, issue 15).

    .venv/bin/python benchmarks/bench_api_instructions.py [--requests 300] [--repeats 2] [--json OUT.json]

Throughput on a shared 2-core machine swings ±30 % between runs; the number of instructions a
server executes per request does not depend on who else runs. Each server (the agent, FastAPI,
the raw uvloop + httptools server: bench_api.py's three, the same model file and onnxruntime
settings) runs under ``valgrind --tool=callgrind``; one client connection sends requests one
after another (keep-alive, c=1); after a warm-up the counters are zeroed
(``callgrind_control -i on``, ``-z``), ``--requests`` requests are sent, and the counts
dumped (``callgrind_control -d``): every thread of the server process is counted (onnxruntime's
workers, the agent's pool and scan threads). Instructions, not time: a cache miss or a
system call's kernel side costs nothing here, so read it beside bench_api.py's wrk figures.
The digits CNN by default; ``--model mobilenet`` counts MobileNetV2 (its peers in their thread
pool, as in bench_api.py: ~1 s per request under valgrind, so use ``--requests 20``).
``--keep DIR`` keeps the callgrind dumps, for ``callgrind_annotate`` (where the instructions go,
by function and library); with ``--cache-sim`` they also hold simulated cache misses (valgrind's
model of this machine's caches, not the hardware's counters, which this VM does not expose).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import (  # noqa: E402
    BODIES,
    ROOT,
    agent_runtime_defaults,
    agent_threads,
    bodies,
    free_port,
    prepare,
    wait_port,
)

VALGRIND = shutil.which("valgrind") or "/usr/bin/valgrind"
CALLGRIND_CONTROL = shutil.which("callgrind_control") or "/usr/bin/callgrind_control"


def http_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body


def send(sock: socket.socket, request: bytes, count: int) -> None:
    """``count`` requests one after another on ``sock``, each answer read whole (200 expected)."""
    for _ in range(count):
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed the connection")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer {head[:200]!r}")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += sock.recv(65536)


def callgrind(pid: int, command: str) -> None:
    subprocess.run([CALLGRIND_CONTROL, command, str(pid)], check=True, capture_output=True, timeout=120)


def instructions(out_prefix: Path, pid: int, before: set[Path]) -> int:
    """The 'totals' of the dump callgrind wrote for ``pid`` since ``before``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = sorted(set(out_prefix.parent.glob(f"{out_prefix.name}.{pid}*")) - before)
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"callgrind wrote no dump for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="counted requests per measurement")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2, help="measurements per server and body")
    parser.add_argument("--bodies", default=",".join(BODIES))
    parser.add_argument("--peers", default="fastapi,raw", help="comma-separated subset of fastapi,raw")
    default_threads, default_spinning = agent_runtime_defaults()
    parser.add_argument("--runtime-threads", type=int, default=default_threads)
    parser.add_argument("--spinning", choices=["on", "off"], default="on" if default_spinning else "off")
    parser.add_argument("--model", choices=["digits", "mobilenet"], default="digits")
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps here")
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="also simulate the caches (valgrind --cache-sim=yes): the dumps kept with --keep then "
        "hold each server's simulated cache misses (I1mr, D1mr, D1mw, ILmr, DLmr, DLmw) beside Ir",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    body_names = tuple(b for b in args.bodies.split(",") if b)
    if not body_names or set(body_names) - set(BODIES):
        parser.error(f"--bodies {args.bodies!r}: pick from {', '.join(BODIES)}")
    peer_kinds = tuple(p for p in args.peers.split(",") if p)
    if not peer_kinds or set(peer_kinds) - {"fastapi", "raw"}:
        parser.error(f"--peers {args.peers!r}: pick from fastapi, raw")
    if args.requests < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--requests and --repeats must be >= 1, --warmup >= 0")
    if not Path(VALGRIND).exists():
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    from tests.agent_helpers import AgentProcess

    runtime = (args.runtime_threads, args.spinning == "on")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        workdir = Path(tmp)
        model = prepare(workdir, (args.model,), runtime)[args.model]
        # The governor's once-a-second sensor poll is not per-request work, but under valgrind
        # the counted requests take ~100x longer and it would be counted: poll once a minute.
        settings = model["device"].settings
        overrides = {**settings, "governor": {**settings["governor"], "poll_interval_s": 60.0}}
        if "--inline" in model["peer_mode"]:
            # Natively the agent answers the digits CNN on the event loop (runs of ~55 µs, under
            # its inline_max_ms of 0.5 ms), as the peers are told to here; under valgrind a run
            # takes ~100x longer and the agent's own decision would send the counted requests
            # through its thread pool, two thread hops the peers do not make. So it is told.
            overrides["api"] = {**settings.get("api", {}), "inline_max_ms": 1e6}
        model["device"].write_config(**overrides)
        out = workdir / "callgrind.out"
        # Instrumentation off until the counted requests: a server starts ~5x slower than
        # natively instead of ~50x (the agent took 9 minutes to start at load 10 with it on).
        valgrind = [VALGRIND, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]
        if args.cache_sim:
            valgrind.append("--cache-sim=yes")
        servers: dict[str, tuple[int, int, str]] = {}
        agent = AgentProcess(
            model["device"],
            start_timeout=600,
            argv=valgrind + [sys.executable, "-m", "edgesdk.agent.cli", "run", "--config", str(model["device"].config)],
        )
        peers: list[subprocess.Popen[bytes]] = []
        try:
            agent.start()
            assert agent.proc is not None and agent.port is not None
            servers["agent"] = (agent.port, agent.proc.pid, f"/v1/models/{args.model}/infer")
            # The peers get the intra-op threads the agent chose for the model (bench_api.py).
            chosen = agent_threads(agent.port, args.model)
            print(f"agent's intra-op threads: {chosen}", flush=True)
            if chosen.startswith("1 (") and "--threads" not in model["peer_mode"]:
                model = {**model, "peer_mode": [*model["peer_mode"], "--threads", "1"]}
            for kind in peer_kinds:
                port = free_port()
                proc = subprocess.Popen(
                    valgrind
                    + [sys.executable, str(ROOT / "benchmarks" / "_fair_peers.py"), kind, str(model["onnx"]), str(port)]
                    + model["peer_mode"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                peers.append(proc)
                wait_port(port, timeout=600)
                servers[kind] = (port, proc.pid, "/infer")
            for repeat in range(args.repeats):
                for body_name in body_names:
                    body, headers = bodies(model["x"])[body_name]
                    for server, (port, pid, path) in servers.items():
                        request = http_request(path, body, headers)
                        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
                            send(sock, request, args.warmup)
                            callgrind(pid, "--instr=on")
                            send(sock, request, 10)  # the newly instrumented code translated
                            callgrind(pid, "-z")
                            send(sock, request, args.requests)
                            before = set(workdir.glob(f"{out.name}.{pid}*"))
                            callgrind(pid, "-d")
                            count = instructions(out, pid, before)
                            callgrind(pid, "--instr=off")
                        per_request = count / args.requests
                        results.setdefault(body_name, {}).setdefault(server, []).append(per_request)
                        print(
                            f"repeat {repeat + 1} {body_name} {server}: {per_request:,.0f} instructions/request",
                            flush=True,
                        )
        finally:
            agent.stop()
            for proc in peers:
                proc.terminate()
                proc.wait(60)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for dump in workdir.glob(f"{out.name}.*"):
                    shutil.copy(dump, args.keep / dump.name)
                print("dumps:", " ".join(f"{s}={pid}" for s, (_, pid, _) in servers.items()), "in", args.keep)
    table = []
    for body_name, by_server in results.items():
        cell: dict[str, Any] = {"body": body_name}
        for server, counts in by_server.items():
            cell[server] = round(min(counts))
            cell[f"{server}_spread"] = round(max(counts) - min(counts))
        for peer in peer_kinds:
            cell[f"agent/{peer}"] = round(cell["agent"] / cell[peer], 2)
        table.append(cell)
    print(f"\nonnxruntime on every server: intra_op_num_threads {runtime[0] or 'default'}, spinning {args.spinning}")
    servers = ("agent", *peer_kinds)
    print("| body | " + " | ".join(servers) + " | " + " | ".join(f"agent ÷ {p}" for p in peer_kinds) + " |")
    print("|---" * (1 + len(servers) + len(peer_kinds)) + "|")
    for c in table:
        counts = " | ".join(f"{c[s]:,} (spread {c[f'{s}_spread']:,})" for s in servers)
        print(f"| {c['body']} | {counts} | " + " | ".join(str(c[f"agent/{p}"]) for p in peer_kinds) + " |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"runtime": {"threads": runtime[0], "spinning": runtime[1]}, "requests": args.requests, "cells": table},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
