"""Which onnxruntime thread settings to serve with, measured with wrk (BENCHMARKS.md, issue 15).

    .venv/bin/python benchmarks/bench_runtime_threads.py [--seconds 2] [--rounds 3] [--json OUT.json]

One minimal uvloop + httptools server (benchmarks/_fair_peers.py ``raw``) per setting, all up
at once, each with one onnxruntime session of the same file: onnxruntime's defaults (one
intra-op thread per core, spinning between runs), spinning off, and ``intra_op_num_threads = 1``
(no worker thread at all). The digits CNN runs inline, MobileNetV2 in a pool of the agent's
``max_concurrency`` threads, as bench_api.py runs them; raw float32 bodies at 1 and 16
connections, rounds interleaved with the order rotated. Reported per cell: req/s, p99, and the
CPU the server spent per answer (all its threads: a spinning worker shows here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import (  # noqa: E402
    ROOT,
    agent_max_concurrency,
    bodies,
    free_port,
    load_average,
    lua_script,
    prepare,
    process_cpu_s,
    run_wrk,
    wait_port,
)

SETTINGS = {
    "default": [],
    "spinning off": ["--spinning", "off"],
    "1 thread": ["--threads", "1"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="digits,mobilenet")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    only = tuple(m for m in args.models.split(",") if m)
    if not only or set(only) - {"digits", "mobilenet"}:
        parser.error(f"--models {args.models!r}: pick from digits, mobilenet")
    samples: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        workdir = Path(tmp)
        models = prepare(workdir, only)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            servers: dict[tuple[str, str], tuple[int, int, Path]] = {}
            for name, model in models.items():
                body, headers = bodies(model["x"])["raw"]
                script = lua_script(workdir, f"{name}-raw", body, headers)
                mode = ["--inline"] if name == "digits" else ["--pool", str(agent_max_concurrency())]
                for setting, flags in SETTINGS.items():
                    port = free_port()
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            str(ROOT / "benchmarks" / "_fair_peers.py"),
                            "raw",
                            str(model["onnx"]),
                            str(port),
                        ]
                        + mode
                        + flags,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    procs.append(proc)
                    wait_port(port)
                    servers[(name, setting)] = (port, proc.pid, script)
            for round_index in range(args.rounds):
                for concurrency in (1, 16):
                    for name in models:
                        order = list(SETTINGS)
                        shift = round_index % len(order)
                        for setting in order[shift:] + order[:shift]:
                            port, pid, script = servers[(name, setting)]
                            run_wrk(port, "/infer", script, concurrency, 1)
                            before = process_cpu_s(pid)
                            row = run_wrk(port, "/infer", script, concurrency, args.seconds)
                            row["cpu_us"] = (process_cpu_s(pid) - before) / max(1, row["answers"]) * 1e6
                            samples.setdefault((name, concurrency, setting), []).append(row)
                loads.append(load_average())
                print(f"round {round_index + 1}/{args.rounds} done (load average {loads[-1]})", flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    cells: list[dict[str, Any]] = []
    for name in models:
        for concurrency in (1, 16):
            base = samples[(name, concurrency, "default")]
            for setting in SETTINGS:
                runs = samples[(name, concurrency, setting)]
                ratios = [r["rps"] / b["rps"] for r, b in zip(runs, base) if b["rps"]]
                cells.append(
                    {
                        "model": name,
                        "c": concurrency,
                        "setting": setting,
                        "rps": round(float(np.median([r["rps"] for r in runs])), 1),
                        "vs_default": round(float(np.median(ratios)), 2),
                        "p99_ms": round(float(np.median([r["p99_ms"] for r in runs])), 2),
                        "cpu_us": round(float(np.median([r["cpu_us"] for r in runs])), 1),
                        "failed": int(sum(r["failed"] for r in runs)),
                    }
                )
    print(f"\nload average before/after each round: {' | '.join(loads)}")
    print("| model | c | setting | req/s | ÷ default | p99 ms | CPU µs per answer |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for c in cells:
        print(
            f"| {c['model']} | {c['c']} | {c['setting']} | {c['rps']} | {c['vs_default']} | {c['p99_ms']} "
            f"| {c['cpu_us']} |" + (f" failed: {c['failed']}" if c["failed"] else "")
        )
    if args.json:
        args.json.write_text(json.dumps({"load_average": loads, "cells": cells}, indent=2))


if __name__ == "__main__":
    main()
