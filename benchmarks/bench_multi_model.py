"""Several models on one device (issue 16), on real ``edge-agent run`` processes and a real mosquitto.

1. Isolation: model B (``digits-b``) under steady request load (2 clients; A gets 1) while model A (``digits``) goes
   through N over-the-air updates that commit and M that fail probation and roll back, pushed by
   the real rollout controller. Reported: B's failed requests (goal 0), B's p50/p99 during A's
   updates vs in idle windows between them (interleaved: idle, update, idle, ...), the ratio.
2. Memory: the agent's RSS with no model, with A alone, with B alone and with both; the growth
   of both over the sum of each alone's growth (goal <= 1.05).

A and B are the same digits network packaged as two models (a second real model at the digits
model's cost). Run: ``.venv/bin/python benchmarks/bench_multi_model.py [--updates 20]
[--rollbacks 5] [--json]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgesdk.offline import disable_vendor_telemetry  # noqa: E402

disable_vendor_telemetry()

from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.schemas.messages import HealthCriteria  # noqa: E402
from tests.agent_helpers import AgentProcess, run_agent_cli  # noqa: E402
from tests.ota_helpers import Operator, build_ota_bundles, make_mqtt_device  # noqa: E402

B = "digits-b"
BODY = json.dumps({"inputs": {"image": [[[[0.0] * 8] * 8]]}}).encode()


class Load:
    """Keep-alive requests to one model in a loop; each (time, seconds, ok) recorded."""

    def __init__(self, port: int, model: str, clients: int = 2) -> None:
        self.port, self.model = port, model
        self.records: list[tuple[float, float, bool]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                conn.request("POST", f"/v1/models/{self.model}/infer", BODY, {"content-type": "application/json"})
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.records.append((time.monotonic(), time.perf_counter() - start, ok))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def window(self, start: float, end: float) -> list[tuple[float, float, bool]]:
        return [r for r in self.records if start <= r[0] < end]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_ms(records: list[tuple[float, float, bool]]) -> dict[str, Any]:
    ok = [s * 1000 for _, s, good in records if good]
    return {
        "requests": len(records),
        "failed": sum(1 for r in records if not r[2]),
        "p50_ms": round(statistics.median(ok), 3) if ok else None,
        "p99_ms": round(p99, 3) if (p99 := percentile(ok, 0.99)) is not None else None,
    }


def install(device: Any, bundle: Path) -> None:
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))
    if proc.returncode != 0:
        raise SystemExit(f"install of {bundle} failed: {proc.stderr.strip()}")


def bench_isolation(work: Path, bundles: Any, broker: MosquittoBroker, updates: int, rollbacks: int) -> dict[str, Any]:
    from edgesdk.bundle import package_bundle

    def pack(name: str, release: int) -> Path:
        return package_bundle(
            work / "convert",
            name=name,
            version=f"1.{release}.0",
            release=release,
            publisher_key=bundles.keys.publisher_key,
            recipients=[bundles.keys.device_pub],
            out=work / f"{name}-{release}.edgepkg",
        )

    device = make_mqtt_device(work / "device", bundles, broker.url)
    install(device, bundles.v1)
    install(device, pack(B, 1))
    # Every (updates // rollbacks)-th step fails its probation (a 1 µs p95 SLO) and rolls back.
    plan = []
    every = max(1, (updates + rollbacks) // max(1, rollbacks))
    release = 2
    for step in range(updates + rollbacks):
        fails = sum(1 for _, f in plan if f) < rollbacks and (step + 1) % every == 0
        plan.append((pack("digits", release), fails))
        release += 1
    operator = Operator(work, bundles, broker.url)
    idle: list[tuple[float, float, bool]] = []
    during: list[tuple[float, float, bool]] = []
    outcomes: dict[str, int] = {}
    try:
        # A gets traffic too (one client): its probation judges its own requests.
        with (
            AgentProcess(device) as agent,
            Load(agent.port or 0, B) as load,
            Load(agent.port or 0, "digits", 1) as a_load,
        ):
            time.sleep(2.0)  # warm
            for bundle, fails in plan:
                start = time.monotonic()
                time.sleep(3.0)
                idle += load.window(start, time.monotonic())
                health = HealthCriteria(probation_s=1.0, p95_latency_ms=0.001 if fails else None)
                start = time.monotonic()
                deployment = operator.push(bundle, health)
                operator.thread.join(300)
                during += load.window(start, time.monotonic())
                state = operator.device_row(deployment).state
                outcomes[state] = outcomes.get(state, 0) + 1
            all_records = list(load.records)
            a_records = list(a_load.records)
    finally:
        operator.close()
    idle_stats, during_stats = latency_ms(idle), latency_ms(during)
    ratio = (
        round(during_stats["p99_ms"] / idle_stats["p99_ms"], 2)
        if during_stats["p99_ms"] and idle_stats["p99_ms"]
        else None
    )
    return {
        "a_outcomes": outcomes,
        "a_requests": len(a_records),
        "a_failed": sum(1 for r in a_records if not r[2]),
        "b_requests": len(all_records),
        "b_failed": sum(1 for r in all_records if not r[2]),
        "b_idle": idle_stats,
        "b_during_a_updates": during_stats,
        "b_p99_ratio_during_vs_idle": ratio,
    }


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def bench_memory(work: Path, bundles: Any, rounds: int = 3) -> dict[str, Any]:
    from edgesdk.bundle import package_bundle

    b1 = package_bundle(
        work / "convert",
        name=B,
        version="1.0.0",
        release=1,
        publisher_key=bundles.keys.publisher_key,
        recipients=[bundles.keys.device_pub],
        out=work / "mem-b.edgepkg",
    )
    setups = {"none": [], "a": [bundles.v1], "b": [b1], "both": [bundles.v1, b1]}
    devices = {}
    for name, installs in setups.items():
        device = make_mqtt_device(work / f"mem-{name}", bundles, "mqtt://127.0.0.1:1")
        device.write_config(**{**device.settings, "mqtt": {"enabled": False}})
        for bundle in installs:
            install(device, bundle)
        devices[name] = device
    measured: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(rounds):  # interleaved: each round starts every setup once
        for name, device in devices.items():
            with AgentProcess(device) as agent:
                for model in [m for m, key in (("digits", "a"), (B, "b")) if key in name or name == "both"]:
                    conn = http.client.HTTPConnection("127.0.0.1", agent.port or 0, timeout=10)
                    for _ in range(50):
                        conn.request("POST", f"/v1/models/{model}/infer", BODY, {"content-type": "application/json"})
                        conn.getresponse().read()
                    conn.close()
                time.sleep(1.0)
                measured[name].append(rss_mb(agent.proc.pid))  # type: ignore[union-attr]
    median = {name: round(statistics.median(values), 1) for name, values in measured.items()}
    growth = {name: round(median[name] - median["none"], 1) for name in ("a", "b", "both")}
    alone = growth["a"] + growth["b"]
    return {
        "rss_mb": median,
        "growth_mb": growth,
        "both_vs_sum_of_each_alone": round(growth["both"] / alone, 3) if alone > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--rollbacks", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import os

    from edgesdk.workloads.digits import prepare_digits

    digits = prepare_digits(ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1")
    with tempfile.TemporaryDirectory(prefix="edgesdk-bench-multi-") as tmp:
        work = Path(tmp)
        bundles = build_ota_bundles(digits, work)
        memory = bench_memory(work, bundles)
        with MosquittoBroker(data_dir=work / "broker") as broker:
            isolation = bench_isolation(work, bundles, broker, args.updates, args.rollbacks)
    result = {"load_average": os.getloadavg(), "isolation": isolation, "memory": memory}
    print(json.dumps(result, indent=2) if args.json else json.dumps(result))


if __name__ == "__main__":
    main()
