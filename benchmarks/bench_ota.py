"""OTA benchmarks, side by side in one run, figures printed (issue 7).

1. Fleet: N simulated devices in ONE process against one local mosquitto, each running the
   real update code (UpdateManager → state machine → chunked MQTT transfer → verify_bundle →
   smoke test in onnxruntime → SlotStore A/B slots → ModelServer swap → probation → commit)
   on its own data dir, updating to a ~5 MB bundle pushed by the real rollout controller and
   chunk server. Reported: time until 100 % committed, MQTT bytes per device / bundle size
   (payloads + topics + fixed headers of every message a device sends or receives for the
   update), mosquitto CPU seconds. Simulated devices share one device key and use a light
   MQTT link (one shared network loop, QoS 1 publish without the SQLite outbox), so a
   thousand paho clients fit one process; everything after the link is the agent's code.
2. Serving during an update: a real ``edge-agent run`` process (real link) under steady
   request load while it downloads, verifies, stages and activates the 5 MB bundle: failed
   requests and p50/p99 before vs during.
3. Rollback speed, on a real ``edge-agent run`` process: time from the failed probation
   decision (p95 SLO breach; the agent's ROLLING_BACK status) to the old model serving again
   (its ``model_loaded`` event) — with the old model kept loaded during probation (the normal
   path) and after the agent was SIGKILLed in probation and started again (the new process
   holds only the new model: verify, decrypt and load the old slot).
4. ``--compare-checks``: the cost of the device's command checks (freshness, audience, replay,
   agent/ota/freshness.py) — the fleet update of part 1 with the real checks and with them
   bypassed (a gate passed in to UpdateManager, never reachable in production), rounds
   alternating in one run; the ratio of the medians; and one check alone (µs, including the
   fsync'd write of the sequence ledger).

Run: ``.venv/bin/python benchmarks/bench_ota.py [--devices 100,500] [--json]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from edgesdk.offline import disable_vendor_telemetry  # noqa: E402

disable_vendor_telemetry()

from edgesdk.agent.ota import UpdateState  # noqa: E402
from edgesdk.agent.ota.freshness import Admission, CommandGate, SequenceLedger  # noqa: E402

from edgesdk.fleet.rollout import RolloutController, RolloutPlan  # noqa: E402
from edgesdk.fleet.service.operator_db import open_rollout_store  # noqa: E402
from edgesdk.keys import load_publisher_private_key  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient, NetworkLoop  # noqa: E402
from edgesdk.protocol import topics  # noqa: E402
from edgesdk.schemas.messages import HealthCriteria  # noqa: E402
from tests.agent_wiring_helpers import updater_for  # noqa: E402
from tests.bundle_helpers import make_keys, write_convert_dir  # noqa: E402
from tests.ota_helpers import PROFILE, StandInAgent  # noqa: E402

MQTT_FIXED_OVERHEAD = 7  # fixed header (≤5) + packet id (2); topic length prefix counted with the topic


# -- the bundles ---------------------------------------------------------------------------------


def wide_mlp_onnx(hidden: int, seed: int) -> bytes:
    """An MLP on the digits input whose weights make the model ~``hidden * 296`` bytes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, hidden)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((hidden, 10)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("MatMul", ["hr", "w2"], ["logits"]),
        ],
        "wide_mlp",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def golden_for(model: bytes) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    images = np.random.default_rng(0).standard_normal((16, 1, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return {"image": images, "output:logits": session.run(["logits"], {"image": images})[0]}


class Bundles:
    """v1: a small model (what devices run first); v2, v3: ~5 MB updates; keys."""

    def __init__(self, root: Path, size_mb: float) -> None:
        from edgesdk.bundle import package_bundle
        from edgesdk.keys import generate_publisher_key

        self.keys = make_keys(root / "keys")
        self.operator_key, self.operator_pub = generate_publisher_key(root / "keys" / "operator")
        small = wide_mlp_onnx(64, seed=1)
        big = wide_mlp_onnx(int(size_mb * 1_000_000 / 296), seed=2)
        self.model_bytes = len(big)
        paths = {}
        bigger = wide_mlp_onnx(int(size_mb * 1_000_000 / 296), seed=3)
        for name, model, release in (("v1", small, 1), ("v2", big, 2), ("v3", bigger, 3)):
            convert = write_convert_dir(
                root / f"convert-{name}", {"onnx-fp32": {"model.onnx": model}}, golden=golden_for(model)
            )
            paths[name] = package_bundle(
                convert,
                name="digits",
                version=f"1.{release}.0",
                release=release,
                publisher_key=self.keys.publisher_key,
                recipients=[self.keys.device_pub],
                targets=[PROFILE],
                out=root / f"{name}.edgepkg",
            )
        self.v1, self.v2, self.v3 = paths["v1"], paths["v2"], paths["v3"]


# -- part 1: the simulated fleet -------------------------------------------------------------------


class BenchLink:
    """The link contract (subscribe / publish_reliable / publish_now) on a shared network loop,
    counting every byte a device sends and receives."""

    def __init__(self, device_id: str, broker_url: str, loop: NetworkLoop, namespace: str = "edgesdk") -> None:
        self.device_id = device_id
        self.namespace = namespace
        self.client = MqttClient(
            ClientOptions(client_id=device_id, broker_url=broker_url, clean_start=True, max_inflight=20), loop=loop
        )
        self.client.on_message = self._on_message
        self.handlers: dict[str, Any] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.messages = 0

    def start(self) -> BenchLink:
        self.client.start()
        return self

    def subscribe(self, suffix: str, handler: Any) -> None:
        self.handlers[suffix] = handler
        self.client.subscribe(topics.device_topic(self.namespace, self.device_id, suffix), qos=1)

    def _on_message(self, topic: str, payload: bytes) -> None:
        self.bytes_in += len(topic) + 2 + len(payload) + MQTT_FIXED_OVERHEAD
        self.messages += 1
        suffix = topic.split(f"/{self.device_id}/", 1)[1]
        handler = self.handlers.get(suffix)
        if handler is not None:
            # Chunk frames are only queued by the handler; deployments start a worker thread.
            handler(payload)

    def _count(self, suffix: str, data: bytes) -> str:
        topic = topics.device_topic(self.namespace, self.device_id, suffix)
        self.bytes_out += len(topic) + 2 + len(data) + MQTT_FIXED_OVERHEAD
        self.messages += 1
        return topic

    def publish_reliable(self, suffix: str, model: Any) -> int:
        data = model.model_dump_json().encode()
        return self.client.publish(self._count(suffix, data), data, qos=1)

    def publish_now(self, suffix: str, payload: Any, qos: int = 0) -> bool:
        data = payload.model_dump_json().encode() if hasattr(payload, "model_dump_json") else bytes(payload)
        if not self.client.connected:
            return False
        self.client.publish(self._count(suffix, data), data, qos=qos)
        return True

    def stop(self) -> None:
        self.client.stop(graceful=False)


class UncheckedGate(CommandGate):
    """The "before" of the checks' cost: admits every signed command (benchmark only)."""

    def __init__(self) -> None:
        pass

    def admit(self, command: Any, issuer: str, *, now: Any = None) -> Admission:
        return Admission.ACT


class SimDevice:
    def __init__(
        self,
        root: Path,
        index: int,
        bundles: Bundles,
        broker_url: str,
        loop: NetworkLoop,
        heavy: threading.Semaphore,
        checks: bool = True,
    ) -> None:
        self.device_id = f"sim-{index:04d}"
        self.link = BenchLink(self.device_id, broker_url, loop)
        self.agent = StandInAgent(root / self.device_id, bundles, device_id=self.device_id, link=self.link)  # type: ignore[arg-type]
        self.manager = updater_for(self.agent, gate=None if checks else UncheckedGate())
        target = self.manager.target
        # Real devices each have their own CPU and RAM; in one process, at most `heavy` simulated
        # devices decrypt and load the model at the same time, or RAM runs out (500 × 5 MB × copies).
        for name in ("verify", "activate"):
            work = getattr(target, name)

            def limited(*args: Any, _work: Any = work, **kwargs: Any) -> Any:
                with heavy:
                    return _work(*args, **kwargs)

            setattr(target, name, limited)

    def install_first(self, bundle: Path) -> None:
        self.manager.install_local(bundle, timeout=120)


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def bench_fleet(
    bundles: Bundles, count: int, root: Path, heavy_concurrency: int, *, checks: bool = True
) -> dict[str, Any]:
    import psutil

    root.mkdir(parents=True)
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        loop = NetworkLoop(name="sim-fleet").start()
        heavy = threading.Semaphore(heavy_concurrency)
        devices = [SimDevice(root / "devices", i, bundles, broker.url, loop, heavy, checks) for i in range(count)]
        for device in devices:
            device.link.start()
        for device in devices:
            device.install_first(bundles.v1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(d.link.client.connected for d in devices):
            time.sleep(0.1)
        for device in devices:
            device.link.bytes_in = device.link.bytes_out = device.link.messages = 0
        operator = MqttClient(
            ClientOptions(client_id="bench-operator", broker_url=broker.url, clean_start=True, max_inflight=1000)
        )
        operator.start()
        operator.wait_connected(10)
        ctl = RolloutController(
            open_rollout_store(root / "fleet.sqlite3"),
            operator,
            "edgesdk",
            load_publisher_private_key(bundles.operator_key),
            poll_s=0.2,
        ).start()
        plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.0, probation_s=1.0, wave_timeout_s=1800)
        message = ctl.create(bundles.v2, [d.device_id for d in devices], plan)
        process = psutil.Process()
        broker_cpu0, own_cpu0 = cpu_seconds(broker.pid), cpu_seconds(process.pid)  # type: ignore[arg-type]
        rss0 = process.memory_info().rss
        start = time.perf_counter()
        state = ctl.run(message.deployment_id)
        elapsed = time.perf_counter() - start
        broker_cpu, own_cpu = cpu_seconds(broker.pid) - broker_cpu0, cpu_seconds(process.pid) - own_cpu0  # type: ignore[arg-type]
        committed = sum(1 for d in devices if d.manager.state is UpdateState.COMMITTED)
        size = bundles.v2.stat().st_size
        per_device = [(d.link.bytes_in + d.link.bytes_out) / size for d in devices]
        rerequests = sum(d.manager.target.download_stats["rerequests"] for d in devices)
        result = {
            "devices": count,
            "rollout_state": state,
            "committed": committed,
            "bundle_bytes": size,
            "seconds_to_all_committed": round(elapsed, 1),
            "wire_bytes_per_device_over_bundle": {
                "mean": round(statistics.mean(per_device), 4),
                "max": round(max(per_device), 4),
            },
            "chunk_rerequests_total": rerequests,
            "broker_cpu_s": round(broker_cpu, 2),
            "fleet_process_cpu_s": round(own_cpu, 1),
            "fleet_process_rss_growth_mb": round((process.memory_info().rss - rss0) / 1e6, 0),
            "heavy_concurrency": heavy_concurrency,
        }
        operator.stop()
        for device in devices:
            device.link.stop()
        loop.stop()
    shutil.rmtree(root, ignore_errors=True)
    return result


# -- part 4: the cost of the command checks --------------------------------------------------------


def bench_one_check(root: Path, count: int = 200) -> dict[str, float]:
    """One CommandGate.admit on a fresh, addressed, new command: median and p90 in µs."""
    from datetime import datetime, timedelta, timezone

    from edgesdk.schemas.messages import Deployment

    root.mkdir(parents=True)
    gate = CommandGate(SequenceLedger(root / "command_sequence.json"), device_id="sim-0000")
    now = datetime.now(timezone.utc)
    base = Deployment(
        deployment_id="bench",
        issued_at=now,
        expires_at=now + timedelta(hours=6),
        sequence=1,
        targets=["sim-0000"],
        model_name="digits",
        model_version="1.0.0",
        release=2,
        bundle_sha256="0" * 64,
        bundle_size=1,
        signature="ed25519:bench:x",
    )
    times = []
    for sequence in range(1, count + 1):
        command = base.model_copy(update={"sequence": sequence, "signature": f"ed25519:bench:{sequence}"})
        start = time.perf_counter()
        gate.admit(command, "bench")
        times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return {"median_us": round(statistics.median(times), 1), "p90_us": round(times[int(0.9 * len(times))], 1)}


def bench_checks(bundles: Bundles, count: int, root: Path, heavy_concurrency: int, rounds: int) -> dict[str, Any]:
    """The fleet update with the device checks on and bypassed, alternating, in one run."""
    seconds: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for index in range(rounds):
        order = ("checked", "unchecked") if index % 2 == 0 else ("unchecked", "checked")
        for mode in order:
            result = bench_fleet(bundles, count, root / f"{mode}-{index}", heavy_concurrency, checks=mode == "checked")
            if result["committed"] != count:
                raise RuntimeError(f"{mode} round {index}: only {result['committed']} of {count} committed")
            seconds[mode].append(result["seconds_to_all_committed"])
    checked, unchecked = statistics.median(seconds["checked"]), statistics.median(seconds["unchecked"])
    return {
        "devices": count,
        "rounds": rounds,
        "seconds_checked": seconds["checked"],
        "seconds_unchecked": seconds["unchecked"],
        "ratio_checked_over_unchecked": round(checked / unchecked, 3),
        "one_check": bench_one_check(root / "one-check"),
    }


# -- part 2: serving during an update (real agent process) ----------------------------------------


def _load(port: int, stop: threading.Event, records: list[tuple[float, float, bool]]) -> None:
    body = json.dumps({"inputs": {"image": np.zeros((1, 1, 8, 8)).tolist()}}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        start = time.perf_counter()
        ok = False
        try:
            connection.request("POST", "/v1/models/digits/infer", body, {"content-type": "application/json"})
            response = connection.getresponse()
            response.read()
            ok = response.status == 200
        except (OSError, http.client.HTTPException):
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        records.append((time.time(), time.perf_counter() - start, ok))


def _stats(records: list[tuple[float, float, bool]]) -> dict[str, Any]:
    latencies = np.array([r[1] for r in records if r[2]]) * 1000
    return {
        "requests": len(records),
        "failed": sum(1 for r in records if not r[2]),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies.size else None,
        "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies.size else None,
    }


def bench_serving(bundles: Bundles, root: Path, clients: int, before_s: float) -> dict[str, Any]:
    from tests.agent_helpers import AgentProcess, run_agent_cli
    from tests.ota_helpers import make_mqtt_device

    root.mkdir(parents=True)
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        device = make_mqtt_device(
            root, bundles, broker.url, mqtt={"enabled": True, "broker": broker.url, "telemetry_interval_s": 5}
        )
        proc = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        with AgentProcess(device) as agent:
            operator = MqttClient(ClientOptions(client_id="bench-operator-2", broker_url=broker.url, clean_start=True))
            operator.start()
            operator.wait_connected(10)
            ctl = RolloutController(
                open_rollout_store(root / "fleet.sqlite3"),
                operator,
                "edgesdk",
                load_publisher_private_key(bundles.operator_key),
                poll_s=0.1,
            ).start()
            records: list[tuple[float, float, bool]] = []
            stop = threading.Event()
            threads = [threading.Thread(target=_load, args=(agent.port, stop, records)) for _ in range(clients)]
            for thread in threads:
                thread.start()
            time.sleep(before_s)
            t_push = time.time()
            plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.0, probation_s=2.0, wave_timeout_s=600)
            message = ctl.create(bundles.v2, ["dev-1"], plan)
            state = ctl.run(message.deployment_id)
            t_done = time.time()
            time.sleep(1.0)
            stop.set()
            for thread in threads:
                thread.join()
            operator.stop()
    before = [r for r in records if r[0] < t_push]
    during = [r for r in records if t_push <= r[0] <= t_done]
    shutil.rmtree(root, ignore_errors=True)
    b, d = _stats(before), _stats(during)
    return {
        "rollout_state": state,
        "update_seconds": round(t_done - t_push, 1),
        "clients": clients,
        "before": b,
        "during": d,
        "p99_during_over_before": round(d["p99_ms"] / b["p99_ms"], 2) if b["p99_ms"] and d["p99_ms"] else None,
    }


# -- part 3: rollback speed (real agent processes) --------------------------------------------------


def _device_with(bundles: Bundles, root: Path, broker_url: str, installed: Path) -> Any:
    from tests.agent_helpers import run_agent_cli
    from tests.ota_helpers import make_mqtt_device

    device = make_mqtt_device(root, bundles, broker_url)  # type: ignore[arg-type]  # same fields as OtaBundles
    proc = run_agent_cli("install", "--config", str(device.config), str(installed))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return device


def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def _one_rollback(bundles: Bundles, root: Path, broker_url: str, restart_in_probation: bool) -> float:
    """One failed probation (a p95 SLO no model meets) on a real ``edge-agent run`` process,
    pushed by the real rollout controller; ms from the decision (the agent's ROLLING_BACK
    status) to the old model serving again (its ``model_loaded`` event), both stamped by the
    agent. With ``restart_in_probation`` the agent is SIGKILLed as soon as it reports
    PROBATION and started again, so the new process has only the new model in memory and
    must verify, decrypt and load the old slot."""
    import signal
    import urllib.request

    from tests.agent_helpers import AgentProcess
    from tests.mqtt_helpers import Collector

    device = _device_with(bundles, root, broker_url, bundles.v2)  # the old model is a 5 MB one too
    observer = Collector(broker_url, "edgesdk/devices/dev-1/#", client_id=f"bench-observer-{root.name}")
    operator = MqttClient(ClientOptions(client_id=f"bench-op-{root.name}", broker_url=broker_url, clean_start=True))
    operator.start()
    operator.wait_connected(10)
    ctl = RolloutController(
        open_rollout_store(root / "fleet.sqlite3"), operator, "edgesdk", load_publisher_private_key(bundles.operator_key),
        poll_s=0.05,
    ).start()  # fmt: skip
    agents = [AgentProcess(device).start()]
    stop = threading.Event()
    load: list[threading.Thread] = []
    try:

        def state() -> str:
            with urllib.request.urlopen(agents[-1].url + "/v1/status", timeout=10) as response:
                return str(json.loads(response.read())["updates"]["state"])

        health = HealthCriteria(probation_s=60, p95_latency_ms=0.0001)
        plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=1.0, probation_s=60, wave_timeout_s=300)
        message = ctl.create(bundles.v3, ["dev-1"], plan, health=health)
        runner = threading.Thread(target=ctl.run, args=(message.deployment_id,), daemon=True)
        runner.start()

        def saved_state() -> str | None:
            try:
                return str(json.loads((device.model_dir() / "ota" / "state.json").read_text())["state"])
            except (OSError, ValueError, KeyError):
                return None  # not written yet, or caught mid-rename

        # PROBATION on disk, not only in the API: a restart resumes from what was saved (killed
        # while ACTIVATING is still on disk, the boot guard rolls back before loading anything).
        _wait_until(lambda: state() == "PROBATION" and saved_state() == "PROBATION", 180, "PROBATION")
        if restart_in_probation:
            # Before the probation has its 20 samples (probes alone need ~5 s): the decision
            # must fall to the restarted process.
            agents[-1].stop(signal.SIGKILL)
            if any(s["state"] == "ROLLING_BACK" for s in observer.json("ota/status")):
                raise RuntimeError("probation failed before the agent could be killed; nothing measured")
            agents.append(AgentProcess(device).start())
        load = [threading.Thread(target=_load, args=(agents[-1].port, stop, [])) for _ in range(2)]
        for thread in load:
            thread.start()

        def stamps() -> tuple[datetime, datetime] | None:
            decided = [s["ts"] for s in observer.json("ota/status") if s["state"] == "ROLLING_BACK"]
            if not decided:
                return None
            decision = datetime.fromisoformat(decided[0])
            loaded = [
                datetime.fromisoformat(e["ts"])
                for e in observer.json("events")
                if e["event"] == "model_loaded" and e["detail"].get("release") == 2
            ]
            loaded = [t for t in loaded if t >= decision]
            return (decision, loaded[0]) if loaded else None

        try:
            _wait_until(lambda: stamps() is not None, 120, "the rollback and the old model's model_loaded event")
        except RuntimeError:
            seen = [(s["state"], s["ts"]) for s in observer.json("ota/status")]
            seen += [(e["event"], e["detail"]) for e in observer.json("events")]
            raise RuntimeError(f"no rollback measured; the agent reported {seen}\n{agents[-1].log()[-2000:]}") from None
        runner.join(60)
        decision, serving_old = stamps()  # type: ignore[misc]
        return (serving_old - decision).total_seconds() * 1000
    finally:
        stop.set()
        for thread in load:
            thread.join()
        ctl.stop()
        operator.stop()
        observer.stop()
        for agent in agents:
            agent.stop()
        shutil.rmtree(root, ignore_errors=True)


def bench_rollback(bundles: Bundles, root: Path, repeat: int) -> dict[str, Any]:
    modes = {"old_model_kept_loaded": False, "after_restart_decrypt_and_load": True}
    results: dict[str, Any] = {}
    root.mkdir(parents=True)
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        for mode, restart in modes.items():
            runs = [_one_rollback(bundles, root / f"{mode}-{i}", broker.url, restart) for i in range(repeat)]
            results[mode] = {
                "median_ms": round(statistics.median(runs), 1),
                "max_ms": round(max(runs), 1),
                "runs": len(runs),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="100,500", help="fleet sizes, comma-separated")
    parser.add_argument("--bundle-mb", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2, help="load threads in the serving benchmark")
    parser.add_argument("--before-s", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--heavy-concurrency", type=int, default=16, help="simulated devices loading models at once")
    parser.add_argument("--skip", default="", help="parts to skip: fleet,serving,rollback")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--compare-checks",
        action="store_true",
        help="only part 4: the fleet update (first --devices size, --repeat rounds) with and without "
        "the device's command checks, and the ratio",
    )
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-ota-"))
    try:
        bundles = Bundles(work / "bundles", args.bundle_mb)
        results: dict[str, Any] = {"bundle_bytes": bundles.v2.stat().st_size, "model_bytes": bundles.model_bytes}
        if args.compare_checks:
            count = int(args.devices.split(",")[0])
            results["checks"] = bench_checks(bundles, count, work / "checks", args.heavy_concurrency, args.repeat)
            print(json.dumps(results, indent=2))
            return
        if "rollback" not in skip:
            results["rollback"] = bench_rollback(bundles, work / "rollback", args.repeat)
            print(json.dumps({"rollback": results["rollback"]}), flush=True)
        if "serving" not in skip:
            results["serving"] = bench_serving(bundles, work / "serving", args.clients, args.before_s)
            print(json.dumps({"serving": results["serving"]}), flush=True)
        if "fleet" not in skip:
            results["fleet"] = []
            for count in (int(c) for c in args.devices.split(",") if c):
                results["fleet"].append(bench_fleet(bundles, count, work / f"fleet-{count}", args.heavy_concurrency))
                print(json.dumps({"fleet": results["fleet"][-1]}), flush=True)
        print(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # the figures, not the agents' warnings
    main()
