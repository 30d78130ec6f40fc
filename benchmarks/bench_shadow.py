"""Client latency with probation's shadow agreement on and off (issue 41), side by side in one run.

A real ``edge-agent run`` process serving the digits CNN, a local mosquitto and the real rollout
controller. Each phase pushes the next release (the same model re-packaged) with a long probation
and measures, while the device is in PROBATION (so the previous release is loaded either way),
``--concurrency`` keep-alive clients posting one digits image per request for ``--seconds``:

* ``off``: ``shadow_rate`` 0 (no shadow);
* ``10 %``: ``shadow_rate`` 0.1, the default;
* ``100 %``: ``shadow_rate`` 1.0 (what a deployment asking the most costs: the one worker and
  its bounded queue, docs/security.md).

Phases alternate (off, 10 %, off, 10 %, 100 %) so a drift of the machine's load shows. Printed:
requests, p50/p99 per phase, and the probation line of each release (what the shadow compared and
dropped). Run: ``.venv/bin/python benchmarks/bench_shadow.py [--seconds 6] [--concurrency 4] [--json]``.

``--model mobilenet`` (the issue's goal: client p99 with shadowing at 10 % within 1.10x of off,
MobileNetV2 at c=4): in process, the agent's serving core (``ModelServer.infer`` then its taps,
as the API calls them after each answer) serving MobileNetV2 (ImageNet weights, ONNX Runtime, one
intra-op thread a session) to ``--concurrency`` client threads, the shadow's reference a second
session of the same model (as the previous release is during probation) run by the real
ShadowRunner. No HTTP or rollout around it: both arms would pay those alike, and on a shared host
they only add noise. Rounds alternate which arm goes first; each round's p99 ratio (10 % / off)
is printed and the median of the ratios is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from edgesdk.offline import disable_vendor_telemetry  # noqa: E402

disable_vendor_telemetry()

from _loadgen import run_load  # noqa: E402

from edgesdk.fleet.rollout import RolloutController, RolloutPlan  # noqa: E402
from edgesdk.fleet.service.operator_db import open_rollout_store  # noqa: E402
from edgesdk.keys import load_publisher_private_key  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from edgesdk.schemas.messages import HealthCriteria  # noqa: E402

PHASES = (("off", 0.0), ("10 %", 0.1), ("off", 0.0), ("10 %", 0.1), ("100 %", 1.0))


def releases(root: Path) -> tuple[Any, list[Path]]:
    """The OTA keys and v1, then one re-packaged release per phase (2, 3, ...)."""
    from edgesdk.bundle import package_bundle
    from edgesdk.workloads.digits import prepare_digits
    from tests.ota_helpers import build_ota_bundles

    digits = prepare_digits(REPO_ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1")
    bundles = build_ota_bundles(digits, root / "bundles")
    later = [
        package_bundle(
            root / "bundles" / "convert",
            name="digits",
            version=f"1.{release}.0",
            release=release,
            publisher_key=bundles.keys.publisher_key,
            recipients=[bundles.keys.device_pub],
            out=root / f"r{release}.edgepkg",
        )
        for release in range(2, 2 + len(PHASES))
    ]
    return bundles, later


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as response:
        return json.loads(response.read())


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def percentiles(records: list[tuple[float, float, int]]) -> dict[str, Any]:
    ms = np.array([(end - start) * 1000 for start, end, code in records if code == 200])
    failed = sum(1 for _, _, code in records if code != 200)
    return {
        "requests": int(ms.size),
        "failed": failed,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


def bench(root: Path, seconds: float, concurrency: int) -> dict[str, Any]:
    from tests.agent_helpers import AgentProcess, run_agent_cli
    from tests.ota_helpers import make_mqtt_device

    bundles, later = releases(root)
    image = np.load(REPO_ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1" / "validation.npz")["image"][:1]
    body = json.dumps({"inputs": {"image": image.astype(np.float32).tolist()}}).encode()
    rows: list[dict[str, Any]] = []
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        device = make_mqtt_device(root / "device", bundles, broker.url)
        proc = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        with AgentProcess(device) as agent:
            port = agent.port
            assert port is not None  # set once the agent listens (AgentProcess.start)
            client = MqttClient(ClientOptions(client_id="bench-shadow", broker_url=broker.url, clean_start=True))
            client.start()
            client.wait_connected(10)
            ctl = RolloutController(
                open_rollout_store(root / "fleet.sqlite3"),
                client,
                "edgesdk",
                load_publisher_private_key(bundles.operator_key),
                poll_s=0.1,
            ).start()
            try:
                for (label, rate), bundle in zip(PHASES, later, strict=True):
                    probation = seconds + 4.0
                    health = HealthCriteria(probation_s=probation, shadow_rate=rate, max_error_rate=1.0)
                    plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.0, probation_s=probation)
                    message = ctl.create(bundle, ["dev-1"], plan, health=health)
                    runner = threading.Thread(target=ctl.run, args=(message.deployment_id,))
                    runner.start()
                    wait_for(lambda: (status(port).get("updates") or {}).get("state") == "PROBATION", 120, "probation")
                    time.sleep(0.5)  # the shadow worker started (it starts as probation does)
                    records, _ = run_load(
                        "127.0.0.1", port, "/v1/models/digits/infer", body,
                        {"content-type": "application/json"}, concurrency=concurrency, seconds=seconds,
                    )  # fmt: skip
                    runner.join(300)
                    final = status(port)["updates"]
                    rows.append({"shadow": label, **percentiles(records), "probation": final["reason"]})
            finally:
                ctl.stop()
                client.stop()
    return {
        "model": "digits CNN (onnx fp32)",
        "concurrency": concurrency,
        "seconds": seconds,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "phases": rows,
    }


def mobilenet_servers(workdir: Path) -> tuple[Any, Any, np.ndarray]:
    """The serving ModelServer and the shadow's reference (two sessions of MobileNetV2), and one photo."""
    import torch
    from edgesdk.agent.serving import ModelServer

    from edgesdk.runtimes import load_model
    from edgesdk.schemas.manifest import Variant
    from edgesdk.workloads import mobilenet

    path = workdir / "mobilenet_v2.onnx"
    net = mobilenet.pretrained_mobilenet_v2().eval()
    torch.onnx.export(
        net, torch.zeros(1, 3, 224, 224), str(path), input_names=["image"], output_names=["logits"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    onnx_bytes = path.read_bytes()
    servers = []
    for release in (1, 2):
        loaded = load_model("onnxruntime", onnx_bytes, options={"intra_op_num_threads": "1"})
        meta = Variant(
            id="onnx-fp32", format="onnx", precision="fp32", runtime="onnxruntime", payload="onnx-fp32",  # type: ignore[arg-type]
            size=len(onnx_bytes), sha256="0" * 64, encrypted_size=len(onnx_bytes), encrypted_sha256="0" * 64,
            inputs=loaded.inputs, outputs=loaded.outputs,
        )  # fmt: skip
        server = ModelServer()
        server.serve(name="mobilenet", version=f"1.{release}.0", release=release, variants=[(meta, loaded)])
        servers.append(server)
    x = np.ascontiguousarray(mobilenet.preprocess(mobilenet.sample_images()[0][1]), dtype=np.float32)
    return servers[1], servers[0], x


def drive(server: Any, x: np.ndarray, concurrency: int, seconds: float) -> list[tuple[float, float, int]]:
    """``concurrency`` clients, each answer then the taps (as the API's route does), for ``seconds``."""
    records: list[tuple[float, float, int]] = []
    stop = time.perf_counter() + seconds

    def client() -> None:
        feeds = {"image": x}
        while time.perf_counter() < stop:
            start = time.perf_counter()
            outputs = server.infer("mobilenet", feeds)
            end = time.perf_counter()  # the answer is sent here; the taps run after it
            if server.taps:
                server.tap("mobilenet", feeds, outputs, "onnx-fp32")
            records.append((start, end, 200))

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


def bench_mobilenet(root: Path, seconds: float, concurrency: int, rounds: int) -> dict[str, Any]:
    from types import SimpleNamespace

    from edgesdk.agent.shadow.agreement import Agreement
    from edgesdk.agent.shadow.runner import ShadowRunner

    server, reference, x = mobilenet_servers(root)
    manifest = SimpleNamespace(golden=SimpleNamespace(metric="top1", gate=0.99))
    drive(server, x, concurrency, 2.0)  # warm-up: both arms start from warm sessions
    rows: list[dict[str, Any]] = []
    for round_index in range(rounds):
        arms = (("off", 0.0), ("10 %", 0.1)) if round_index % 2 == 0 else (("10 %", 0.1), ("off", 0.0))
        for label, rate in arms:
            runner = None
            if rate:
                runner = ShadowRunner("mobilenet", reference, Agreement(manifest), rate=rate).start()
                server.taps.append(runner.tap)
            records = drive(server, x, concurrency, seconds)
            counts = ""
            if runner is not None:
                server.taps.remove(runner.tap)
                runner.stop()
                counts = runner.counts()
            rows.append({"round": round_index, "shadow": label, **percentiles(records), "shadow_counts": counts})
    ratios = []
    for round_index in range(rounds):
        by_arm = {row["shadow"]: row for row in rows if row["round"] == round_index}
        ratios.append(round(by_arm["10 %"]["p99_ms"] / by_arm["off"]["p99_ms"], 3))
    return {
        "model": "MobileNetV2 (onnx fp32, 1 intra-op thread a session; in process: ModelServer + taps)",
        "concurrency": concurrency,
        "seconds": seconds,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "phases": rows,
        "p99_ratios": ratios,
        "median_p99_ratio": float(np.median(ratios)),
    }


def print_mobilenet(result: dict[str, Any]) -> None:
    print(f"{result['model']}, c={result['concurrency']}, {result['seconds']:g} s per arm, {result['cpus']} CPUs")
    print(f"{'round':>5} {'shadow':>7} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for row in result["phases"]:
        print(f"{row['round']:>5} {row['shadow']:>7} {row['requests']:>9} {row['p50_ms']:>8} {row['p99_ms']:>8}")
    print(f"p99 ratio 10 % / off per round: {result['p99_ratios']}; median {result['median_p99_ratio']:.3f}")
    print(f"shadow: {[row['shadow_counts'] for row in result['phases'] if row['shadow_counts']]}")
    print(f"load average after: {result['load_average']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", choices=("digits", "mobilenet"), default="digits")
    parser.add_argument("--rounds", type=int, default=4, help="mobilenet: interleaved rounds of off and 10 %%")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    try:
        if args.model == "mobilenet":
            result = bench_mobilenet(root, args.seconds, args.concurrency, args.rounds)
        else:
            result = bench(root, args.seconds, args.concurrency)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if args.model == "mobilenet":
        print_mobilenet(result)
        return
    print(f"{result['model']}, c={result['concurrency']}, {result['seconds']:g} s per phase, {result['cpus']} CPUs")
    print(f"{'shadow':>7} {'requests':>9} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for row in result["phases"]:
        print(f"{row['shadow']:>7} {row['requests']:>9} {row['failed']:>6} {row['p50_ms']:>8} {row['p99_ms']:>8}")
    for row in result["phases"]:
        print(f"  {row['shadow']}: {row['probation']}")
    print(f"load average after: {result['load_average']}")


if __name__ == "__main__":
    main()
