"""The agent's local API against fair peers, measured with wrk (BENCHMARKS.md, "Local API vs fair peers").

    .venv/bin/python benchmarks/bench_api.py [--quick] [--seconds 10] [--rounds 3] [--json OUT.json]

Servers, all up at once, each serving the same ONNX file with one onnxruntime session
(the same session options on every side: the agent's defaults, or ``--runtime-threads`` /
``--spinning``):

* ``agent``: ``edge-agent run`` with the model installed from a signed, encrypted bundle;
* ``fastapi``: FastAPI ``async def`` + ``await request.body()`` on ``uvicorn --loop uvloop
  --http httptools``, orjson, access log off (benchmarks/_fair_peers.py);
* ``raw``: a minimal ``asyncio.Protocol`` + httptools server on uvloop (same file).

The peers run the digits CNN inline on the event loop and MobileNetV2 in a thread pool with
as many workers as the agent's ``max_concurrency``. Bodies: JSON (as Python's ``json.dumps``
writes a float32 array's ``tolist()``), ``.npy`` and raw float32 (``X-Tensors``); each server
answers in the request's encoding. Before measuring, every server's answer to every body is
checked against the others (the same logits), so all do the same work.

Load: ``wrk`` (C, one thread) with a Lua script that posts the body, at 1 and 16 connections;
per cell a 1 s warm-up, then the measured run. Rounds interleave every cell and rotate the
server order, so load from other processes hits every server alike. Reported per cell: median
requests/s and p99 over the rounds, and the ratios agent ÷ peer as the median of the per-round
ratios (each pair measured seconds apart); and the CPU each server process spent per answer
(user + system, all its threads, from /proc), which other processes' load moves far less than
throughput: it does not count the time a server waited for a core. ``--models``, ``--bodies``
and ``--concurrency`` pick a subset of the cells.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_agent import free_port, wait_port  # noqa: E402

from edgesdk.offline import disable_vendor_telemetry  # noqa: E402

disable_vendor_telemetry()

WRK = shutil.which("wrk") or "/usr/bin/wrk"
SERVERS = ("agent", "fastapi", "raw")
CONCURRENCY = (1, 16)
BODIES = ("json", "npy", "raw")

_LUA = """
local f = assert(io.open("{body}", "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "socket_errors": %d, "non2xx": %d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


# -- models and servers ----------------------------------------------------------------------------


def mobilenet_convert_dir(out: Path) -> Path:
    """A convert dir holding MobileNetV2 (ImageNet weights) as one fp32 ONNX variant, checked
    against torch on the bundled photos (the agreement is its accuracy record)."""
    import onnxruntime as ort
    import torch

    from edgesdk.schemas.manifest import AccuracyResult, TensorSpec
    from edgesdk.schemas.report import ConversionReport, ShippedVariant
    from edgesdk.workloads import mobilenet

    if (out / "report.json").exists():
        return out
    work = out.with_name(out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    (work / "artifacts" / "onnx-fp32").mkdir(parents=True)
    onnx_path = work / "artifacts" / "onnx-fp32" / "model.onnx"
    net = mobilenet.pretrained_mobilenet_v2().eval()
    torch.onnx.export(
        net,
        torch.zeros(1, 3, 224, 224),
        str(onnx_path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    images = np.stack([mobilenet.preprocess(img)[0] for _, img in mobilenet.sample_images()[:8]])
    with torch.no_grad():
        reference = net(torch.from_numpy(images)).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"image": images})[0]
    agreement = float((logits.argmax(1) == reference.argmax(1)).mean())
    variant = ShippedVariant(
        id="onnx-fp32",
        format="onnx",  # type: ignore[arg-type]
        precision="fp32",  # type: ignore[arg-type]
        runtime="onnxruntime",  # type: ignore[arg-type]
        files=[onnx_path.relative_to(work).as_posix()],
        size=onnx_path.stat().st_size,
        inputs=[TensorSpec(name="image", dtype="float32", shape=["batch", 3, 224, 224])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", 1000])],
        accuracy=AccuracyResult(
            metric="top1", value=agreement, gate=0.98, passed=agreement >= 0.98, samples=len(images)
        ),
    )
    np.savez(work / "golden.npz", image=images[:2], **{"output:logits": logits[:2]})  # type: ignore[arg-type]
    report = ConversionReport(
        model_name="mobilenet",
        source="edgesdk.workloads.mobilenet:pretrained_mobilenet_v2",
        profile="rpi5-8gb",
        created=datetime.now(timezone.utc),
        metric="top1",
        gate=0.98,
        variants=[variant],
    )
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return out


def agent_runtime_defaults() -> tuple[int | None, bool]:
    """The agent's default onnxruntime settings (runtime_threads, runtime_spinning)."""
    from edgesdk.schemas.agent_config import AgentConfig

    fields = AgentConfig.model_fields
    return fields["runtime_threads"].default, fields["runtime_spinning"].default


def runtime_flags(threads: int | None, spinning: bool) -> list[str]:
    """_fair_peers.py's flags for the agent's runtime settings: every server runs alike."""
    return (["--threads", str(threads)] if threads else []) + ["--spinning", "on" if spinning else "off"]


def prepare(
    workdir: Path,
    only: tuple[str, ...] = ("digits", "mobilenet"),
    runtime: tuple[int | None, bool] | None = None,
    api: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per model: the ONNX file, an installed agent device, one sample input, how peers run it
    (``runtime``: onnxruntime's threads and spinning for every server; the agent's defaults).
    ``api``: settings of the agent's ``[api]`` section other than its defaults."""
    threads, spinning = runtime or agent_runtime_defaults()
    from edgesdk.workloads import mobilenet
    from edgesdk.workloads.digits import prepare_digits
    from tests.agent_helpers import make_device, run_agent_cli
    from tests.bundle_helpers import make_digits_convert_dir

    cache = ROOT / ".pytest_cache" / "d"
    digits = prepare_digits(cache / "edgesdk-digits-v1")
    # fp32 only: the agent then serves exactly the file the peers load.
    converts = {}
    if "digits" in only:
        converts["digits"] = make_digits_convert_dir(digits, cache / "bench-api-digits-fp32", int8=False)
    if "mobilenet" in only:
        converts["mobilenet"] = mobilenet_convert_dir(cache / "bench-api-mobilenet-fp32")
    inputs = {
        "digits": lambda: np.load(digits.validation)["image"][:1].astype(np.float32),
        "mobilenet": lambda: np.ascontiguousarray(mobilenet.preprocess(mobilenet.sample_images()[0][1]), np.float32),
    }
    models: dict[str, dict[str, Any]] = {}
    for name, convert in converts.items():
        device = make_device(workdir / name)
        device.write_config(
            log_format="json",
            log_level="warning",
            governor={"source": "psutil", "poll_interval_s": 1.0},
            runtime_spinning=spinning,
            **({"runtime_threads": threads} if threads else {}),
            **({"api": api} if api else {}),
        )
        bundle = device.bundle(convert, version="1.0.0", release=1, name=name)
        proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))
        if proc.returncode:
            raise RuntimeError(proc.stderr)
        models[name] = {
            "onnx": convert / "artifacts" / "onnx-fp32" / "model.onnx",
            "device": device,
            "x": inputs[name](),
            "peer_mode": (["--inline"] if name == "digits" else ["--pool", str(agent_max_concurrency())])
            + runtime_flags(threads, spinning),
        }
    return models


def agent_max_concurrency() -> int:
    from edgesdk.schemas.agent_config import ApiConfig

    return ApiConfig().max_concurrency


def bodies(x: np.ndarray) -> dict[str, tuple[bytes, dict[str, str]]]:
    npy = io.BytesIO()
    np.save(npy, x, allow_pickle=False)
    dims = ",".join(str(d) for d in x.shape)
    return {
        "json": (json.dumps({"inputs": {"image": x.tolist()}}).encode(), {"Content-Type": "application/json"}),
        "npy": (npy.getvalue(), {"Content-Type": "application/x-npy"}),
        "raw": (
            x.astype("<f4").tobytes(),
            {"Content-Type": "application/x-edgesdk-tensors", "X-Tensors": f"image=float32[{dims}]"},
        ),
    }


def start_peer(kind: str, model: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "_fair_peers.py"), kind, str(model["onnx"]), str(port)]
        + model["peer_mode"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def decode_answer(content_type: str, data: bytes) -> np.ndarray:
    if content_type.startswith("application/json"):
        return np.asarray(json.loads(data)["outputs"]["logits"], np.float32)
    if content_type.startswith("application/x-npy"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    return np.frombuffer(data, "<f4")


def agent_threads(port: int, model_name: str) -> str:
    """The intra-op threads the agent runs ``model_name``'s active variant with, and why."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
        described = json.loads(answer.read())["models"]
    model = next(m for m in described if m["name"] == model_name)
    variant = next(v for v in model["variants"] if v["id"] == model["active_variant"])
    return str(variant.get("threads") or "onnxruntime default")


def matched_to_agent(model: dict[str, Any], threads: str) -> dict[str, Any]:
    """``model`` with its peers' flags matched to the intra-op ``threads`` the agent runs it
    with (``agent_threads``). Left to the agent (runtime_threads unset), it times the model with
    one intra-op thread at load and keeps one when that is faster (a tiny model): the peers get
    what it chose, so every server runs the model alike (with onnxruntime's default, two
    threads here, the digits CNN costs a peer ~10 % more CPU per answer, and a dozen futex
    calls per answer)."""
    if model.get("peers_on_defaults"):
        return model
    if threads.startswith("1 (") and "--threads" not in model["peer_mode"]:
        return {**model, "peer_mode": [*model["peer_mode"], "--threads", "1"]}
    return model


def on_runtime_defaults(peer_mode: list[str]) -> list[str]:
    """``peer_mode`` without the runtime flags: the peer runs onnxruntime as it comes."""
    kept: list[str] = []
    flags = iter(peer_mode)
    for flag in flags:
        if flag in ("--threads", "--spinning"):
            next(flags, None)  # and its value
        else:
            kept.append(flag)
    return kept


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> np.ndarray:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return decode_answer(answer.headers.get("Content-Type", ""), answer.read()).reshape(-1)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"POST {path} on port {port} ({headers}): {exc.code} {exc.read()[:300]!r}") from exc


# -- measuring ---------------------------------------------------------------------------------------


def run_wrk(port: int, path: str, lua: Path, concurrency: int, seconds: float) -> dict[str, float]:
    proc = subprocess.run(
        [
            WRK,
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "20s",
            "-s",
            str(lua),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{proc.stdout}\n{proc.stderr}")
    raw = json.loads(line[len("WRKJSON ") :])
    ok = raw["requests"] - raw["non2xx"]
    return {
        "rps": ok / (raw["duration_us"] / 1e6),
        "answers": raw["requests"],
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "failed": raw["non2xx"] + raw["socket_errors"],
    }


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def lua_script(workdir: Path, name: str, body: bytes, headers: dict[str, str]) -> Path:
    body_path = workdir / f"{name}.body"
    body_path.write_bytes(body)
    header_lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    script = workdir / f"{name}.lua"
    script.write_text(_LUA.format(body=body_path, headers=header_lines))
    return script


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def bench(
    models: dict[str, dict[str, Any]],
    workdir: Path,
    seconds: float,
    rounds: int,
    body_names: tuple[str, ...] = BODIES,
    concurrencies: tuple[int, ...] = CONCURRENCY,
) -> dict[str, Any]:
    from tests.agent_helpers import AgentProcess

    peers: list[subprocess.Popen[bytes]] = []
    agents: list[Any] = []
    samples: dict[tuple[str, str, int, str], list[dict[str, float]]] = {}
    checks: dict[str, float] = {}
    pids: dict[str, dict[str, int]] = {}
    threads: dict[str, str] = {}
    loads = [load_average()]
    try:
        cells = []
        for model_name, model in models.items():
            agent = AgentProcess(model["device"]).start()
            agents.append(agent)
            ports = {"agent": (agent.port, f"/v1/models/{model_name}/infer")}
            pids[model_name] = {"agent": agent.proc.pid}
            threads[model_name] = agent_threads(agent.port, model_name)
            model = matched_to_agent(model, threads[model_name])
            for kind in ("fastapi", "raw"):
                proc, port = start_peer(kind, model)
                peers.append(proc)
                ports[kind] = (port, "/infer")
                pids[model_name][kind] = proc.pid
            for body_name, (body, headers) in bodies(model["x"]).items():
                if body_name not in body_names:
                    continue
                answers = {server: post(port, path, body, headers) for server, (port, path) in ports.items()}
                worst = max(float(np.max(np.abs(a - answers["raw"]))) for a in answers.values())
                checks[f"{model_name} {body_name}"] = worst
                if worst > 1e-3:
                    raise RuntimeError(f"{model_name} {body_name}: the servers disagree by {worst:g}")
                for server, (port, path) in ports.items():
                    script = lua_script(workdir, f"{model_name}-{body_name}-{server}", body, headers)
                    cells.append((model_name, body_name, server, port, path, script))
        for round_index in range(rounds):
            for concurrency in concurrencies:
                for model_name in models:
                    for body_name in body_names:
                        group = [c for c in cells if c[0] == model_name and c[1] == body_name]
                        shift = round_index % len(group)
                        for _, _, server, port, path, script in group[shift:] + group[:shift]:
                            run_wrk(port, path, script, concurrency, 1)  # warm-up (wrk counts whole seconds)
                            cpu_before = process_cpu_s(pids[model_name][server])
                            row = run_wrk(port, path, script, concurrency, seconds)
                            # CPU the server spent per answer: what other processes' load moves
                            # least (it does not count time the server waited for a core).
                            cpu = process_cpu_s(pids[model_name][server]) - cpu_before
                            row["cpu_us"] = cpu / max(1, row["answers"]) * 1e6
                            samples.setdefault((model_name, body_name, concurrency, server), []).append(row)
            loads.append(load_average())
            print(f"round {round_index + 1}/{rounds} done (load average {loads[-1]})", flush=True)
    finally:
        for agent in agents:
            agent.stop()
        for proc in peers:
            proc.terminate()
            proc.wait(10)
    table = []
    for model_name in models:
        for body_name in body_names:
            for concurrency in concurrencies:
                rows = {s: samples[(model_name, body_name, concurrency, s)] for s in SERVERS}
                cell: dict[str, Any] = {"model": model_name, "body": body_name, "c": concurrency}
                for server, runs in rows.items():
                    cell[f"{server}_rps"] = round(float(np.median([r["rps"] for r in runs])), 1)
                    cell[f"{server}_p99_ms"] = round(float(np.median([r["p99_ms"] for r in runs])), 2)
                    cell[f"{server}_failed"] = int(sum(r["failed"] for r in runs))
                    cell[f"{server}_cpu_us"] = round(float(np.median([r["cpu_us"] for r in runs])), 1)
                for peer in ("fastapi", "raw"):
                    ratios = [a["rps"] / p["rps"] for a, p in zip(rows["agent"], rows[peer]) if p["rps"]]
                    cell[f"agent/{peer}"] = round(float(np.median(ratios)), 2) if ratios else None
                    # > 1: the agent spends less CPU per answer than the peer.
                    cpu = [p["cpu_us"] / a["cpu_us"] for a, p in zip(rows["agent"], rows[peer]) if a["cpu_us"]]
                    cell[f"cpu {peer}/agent"] = round(float(np.median(cpu)), 2) if cpu else None
                table.append(cell)
    return {
        "seconds_per_cell": seconds,
        "rounds": rounds,
        "peer_execution": {
            "digits": "inline on the event loop",
            "mobilenet": f"thread pool of {agent_max_concurrency()} workers (the agent's max_concurrency)",
        },
        "subset": {"models": list(models), "bodies": list(body_names), "concurrency": list(concurrencies)},
        "answers_max_abs_difference": checks,
        "agent_threads": threads,
        "load_average": loads,
        "cells": table,
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['seconds_per_cell']:g} s per cell, {result['rounds']} interleaved rounds; "
        f"peers: digits {result['peer_execution']['digits']}, MobileNetV2 {result['peer_execution']['mobilenet']}"
    )
    print(f"load average before/after each round: {' | '.join(result['load_average'])}")
    if "runtime" in result:
        print(f"onnxruntime on every server: {result['runtime']}")
    if "peer_json" in result:
        print(f"the peers read JSON bodies with {result['peer_json']}")
    for model_name, why in result.get("agent_threads", {}).items():
        print(f"{model_name}: intra-op threads {why} (the peers run the same)")
    header = (
        "| model | body | c | agent req/s | FastAPI req/s | raw req/s | agent p99 ms | FastAPI p99 ms | raw p99 ms "
        "| agent ÷ FastAPI | agent ÷ raw | CPU µs/answer agent / FastAPI / raw | CPU raw ÷ agent |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for c in result["cells"]:
        failed = sum(c[f"{s}_failed"] for s in SERVERS)
        print(
            f"| {c['model']} | {c['body']} | {c['c']} | {c['agent_rps']} | {c['fastapi_rps']} | {c['raw_rps']} "
            f"| {c['agent_p99_ms']} | {c['fastapi_p99_ms']} | {c['raw_p99_ms']} "
            f"| {_mark(c['agent/fastapi'], 1.0)} | {_mark(c['agent/raw'], 1.0)} "
            f"| {c['agent_cpu_us']} / {c['fastapi_cpu_us']} / {c['raw_cpu_us']} | {c['cpu raw/agent']} |"
            + (f" failed: {failed}" if failed else "")
        )


def _mark(ratio: float | None, goal: float) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.2f}" if ratio >= goal else f"**{ratio:.2f}** (not met)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per cell and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 s per cell")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--models", default="digits,mobilenet", help="comma-separated subset of digits,mobilenet")
    parser.add_argument("--bodies", default=",".join(BODIES), help=f"comma-separated subset of {','.join(BODIES)}")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated, e.g. 1,16")
    default_threads, default_spinning = agent_runtime_defaults()
    parser.add_argument(
        "--runtime-threads", type=int, default=default_threads, help="onnxruntime intra-op threads, every server"
    )
    parser.add_argument(
        "--spinning",
        choices=["on", "off"],
        default="on" if default_spinning else "off",
        help="onnxruntime intra-op spin-wait, every server (default: the agent's runtime_spinning)",
    )
    parser.add_argument(
        "--peer-json",
        choices=["orjson", "simdjson"],
        default="orjson",
        help="how the peers read JSON bodies (default orjson, the issue's recipe; simdjson: as the agent reads large ones)",
    )
    parser.add_argument(
        "--inline-batch-max",
        type=int,
        help="the agent's api.inline_batch_max (default: the agent's own, 16; 1: no batches on the event loop)",
    )
    parser.add_argument(
        "--peers-on-defaults",
        action="store_true",
        help="the peers run onnxruntime on its own defaults (intra-op threads and spin-wait), the agent on "
        "its own: what a user gets from each out of the box (issue 39's cell); default: every server alike",
    )
    args = parser.parse_args()
    only = tuple(m for m in args.models.split(",") if m)
    body_names = tuple(b for b in args.bodies.split(",") if b)
    if not only or set(only) - {"digits", "mobilenet"}:
        parser.error(f"--models {args.models!r}: pick from digits, mobilenet")
    if not body_names or set(body_names) - set(BODIES):
        parser.error(f"--bodies {args.bodies!r}: pick from {', '.join(BODIES)}")
    try:
        concurrencies = tuple(int(c) for c in args.concurrency.split(",") if c)
    except ValueError:
        parser.error(f"--concurrency {args.concurrency!r}: comma-separated connection counts, e.g. 1,16")
    if not concurrencies or min(concurrencies) < 1:
        parser.error(f"--concurrency {args.concurrency!r}: at least one connection count, each >= 1")
    if args.runtime_threads is not None and args.runtime_threads < 1:
        parser.error(f"--runtime-threads {args.runtime_threads}: at least 1 (leave it out for onnxruntime's default)")
    if args.inline_batch_max is not None and not 1 <= args.inline_batch_max <= 64:
        parser.error(f"--inline-batch-max {args.inline_batch_max}: from 1 (no batches) to 64")
    if args.seconds <= 0 or args.rounds < 1:
        parser.error(
            f"--seconds {args.seconds:g} / --rounds {args.rounds}: need a positive time and at least one round"
        )
    if not Path(WRK).exists():
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    seconds = 3.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        workdir = Path(tmp)
        runtime = (args.runtime_threads, args.spinning == "on")
        api = {"inline_batch_max": args.inline_batch_max} if args.inline_batch_max else None
        models = prepare(workdir, only, runtime, api)
        if args.peers_on_defaults:
            models = {
                name: {**m, "peer_mode": on_runtime_defaults(m["peer_mode"]), "peers_on_defaults": True}
                for name, m in models.items()
            }
        if args.peer_json != "orjson":
            models = {
                name: {**m, "peer_mode": [*m["peer_mode"], "--json", args.peer_json]} for name, m in models.items()
            }
        started = time.monotonic()
        result = bench(models, workdir, seconds, args.rounds, body_names, concurrencies)
        result["runtime"] = {"intra_op_num_threads": runtime[0] or "onnxruntime default", "spinning": runtime[1]}
        if args.peers_on_defaults:
            result["runtime"]["peers"] = "onnxruntime's defaults"
        result["peer_json"] = args.peer_json
        result["agent_inline_batch_max"] = args.inline_batch_max or "the agent's default"
        result["wall_s"] = round(time.monotonic() - started, 1)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
