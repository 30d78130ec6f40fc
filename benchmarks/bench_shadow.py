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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    try:
        result = bench(root, args.seconds, args.concurrency)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
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
