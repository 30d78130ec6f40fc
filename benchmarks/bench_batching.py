"""Dynamic batching on MobileNetV2 at concurrency 16, measured with wrk (BENCHMARKS.md, "Dynamic batching").

    .venv/bin/python benchmarks/bench_batching.py [--seconds 3] [--rounds 2] [--delays 0,500,2000,5000]
        [--max-batch-size 8] [--concurrent-batches 1] [--body raw] [--json OUT.json]

One agent per setting, all up at once, each serving the same MobileNetV2 fp32 ONNX variant
(bench_api.py's) from a signed, encrypted bundle: one with batching off (the default
configuration), one per ``max_queue_delay_us`` with ``max_batch_size`` rows. Before measuring,
every agent's answer to the body is compared with the unbatched agent's. Load: ``wrk`` at 16
connections posting one image (1×3×224×224) each; per cell a 1 s warm-up, then the measured run;
rounds interleave the settings and rotate their order. Reported per setting: median requests/s
and p99 over the rounds, and the ratio batched ÷ unbatched as the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from bench_api import ROOT, WRK, bodies, load_average, lua_script, mobilenet_convert_dir, post, run_wrk

from edgesdk.schemas.agent_config import BatchingSettings  # noqa: E402 - after bench_api set sys.path

CONCURRENCY = 16
PATH = "/v1/models/mobilenet/infer"


def prepare(workdir: Path, settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An installed device per setting (name → its ``[api.batching]``), and the input image."""
    from edgesdk.workloads import mobilenet
    from tests.agent_helpers import make_device, run_agent_cli

    convert = mobilenet_convert_dir(ROOT / ".pytest_cache" / "d" / "bench-api-mobilenet-fp32")
    devices = {}
    for name, batching in settings.items():
        device = make_device(workdir / name)
        device.write_config(
            log_format="json",
            log_level="warning",
            governor={"source": "psutil", "poll_interval_s": 1.0},
            api={"host": "127.0.0.1", "port": 0, "batching": batching},
        )
        bundle = device.bundle(convert, version="1.0.0", release=1, name="mobilenet")
        proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))
        if proc.returncode:
            raise RuntimeError(proc.stderr)
        devices[name] = device
    x = np.ascontiguousarray(mobilenet.preprocess(mobilenet.sample_images()[0][1]), np.float32)
    return {"devices": devices, "x": x}


def bench(prepared: dict[str, Any], workdir: Path, body_name: str, seconds: float, rounds: int) -> dict[str, Any]:
    from tests.agent_helpers import AgentProcess

    body, headers = bodies(prepared["x"])[body_name]
    agents: dict[str, Any] = {}
    samples: dict[str, list[dict[str, float]]] = {}
    differences: dict[str, float] = {}
    loads = [load_average()]
    try:
        for name, device in prepared["devices"].items():
            agents[name] = AgentProcess(device).start()
        reference = post(agents["off"].port, PATH, body, headers)
        scripts = {}
        for name, agent in agents.items():
            # 32 requests 16 at a time: batched ones are answered from batches, compared with unbatched.
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                answers = list(pool.map(lambda _, port=agent.port: post(port, PATH, body, headers), range(32)))
            differences[name] = max(float(np.max(np.abs(a - reference))) for a in answers)
            scripts[name] = lua_script(workdir, f"batching-{name}", body, headers)
        names = list(agents)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                run_wrk(agents[name].port, PATH, scripts[name], CONCURRENCY, 1)  # warm-up
                samples.setdefault(name, []).append(
                    run_wrk(agents[name].port, PATH, scripts[name], CONCURRENCY, seconds)
                )
            loads.append(load_average())
            print(f"round {round_index + 1}/{rounds} done (load average {loads[-1]})", flush=True)
    finally:
        for agent in agents.values():
            agent.stop()
    cells = []
    for name, runs in samples.items():
        ratios = [r["rps"] / o["rps"] for r, o in zip(runs, samples["off"]) if o["rps"]]
        cells.append(
            {
                "setting": name,
                "rps": round(float(np.median([r["rps"] for r in runs])), 1),
                "p50_ms": round(float(np.median([r["p50_ms"] for r in runs])), 1),
                "p99_ms": round(float(np.median([r["p99_ms"] for r in runs])), 1),
                "failed": int(sum(r["failed"] for r in runs)),
                "vs_off": round(float(np.median(ratios)), 2) if ratios else None,
                "max_abs_difference_vs_off": differences[name],
            }
        )
    return {
        "body": body_name,
        "c": CONCURRENCY,
        "seconds_per_cell": seconds,
        "rounds": rounds,
        "load_average": loads,
        "cells": cells,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delays", default="0,500,2000,5000", help="max_queue_delay_us values, comma-separated")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument(
        "--concurrent-batches", type=int, default=BatchingSettings().max_concurrent_batches, help="default: the agent's"
    )
    parser.add_argument("--body", choices=("json", "npy", "raw"), default="raw")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        parser.error(f"--seconds {args.seconds:g} / --rounds {args.rounds}: need a positive time and a round")
    if not Path(WRK).exists():
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    settings: dict[str, dict[str, Any]] = {"off": {"enabled": False}}
    for delay in (int(d) for d in args.delays.split(",")):
        settings[f"delay {delay} us"] = {
            "enabled": True,
            "max_batch_size": args.max_batch_size,
            "max_queue_delay_us": delay,
            "max_concurrent_batches": args.concurrent_batches,
        }
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        workdir = Path(tmp)
        result = bench(prepare(workdir, settings), workdir, args.body, args.seconds, args.rounds)
    result["max_batch_size"] = args.max_batch_size
    result["max_concurrent_batches"] = args.concurrent_batches
    print(
        f"\nMobileNetV2, {args.body} body, c={CONCURRENCY}, max_batch_size {args.max_batch_size}, "
        f"{args.concurrent_batches} batch(es) at once; {args.seconds:g} s per cell, {args.rounds} rounds"
    )
    print(f"load average before/after each round: {' | '.join(result['load_average'])}")
    print("| setting | req/s | ÷ off | p50 ms | p99 ms | max abs diff vs off |")
    print("|---|---|---|---|---|---|")
    for c in result["cells"]:
        print(
            f"| {c['setting']} | {c['rps']} | {c['vs_off']} | {c['p50_ms']} | {c['p99_ms']} "
            f"| {c['max_abs_difference_vs_off']:.2g} |" + (f" failed: {c['failed']}" if c["failed"] else "")
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
