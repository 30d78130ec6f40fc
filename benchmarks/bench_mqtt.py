"""MQTT link benchmarks against one local mosquitto (all figures printed; see BENCHMARKS.md).

1. Telemetry scale: N simulated devices — each a real ``MqttClient`` + SQLite ``MessageQueue``
   + ``QueueForwarder`` (the agent's code), many sharing one ``NetworkLoop`` in this process —
   publish 1 message/s each for ``--duration`` seconds. A separate observer process subscribes
   to all of them at QoS 1 and counts unique (device, seq) pairs. N is stepped up until a step
   loses messages or falls behind (p95 end-to-end latency over 1 s). Broker, client-process and
   observer CPU are reported as % of one core.
2. Drain rate: one device queues ``--drain-messages`` while the broker is down; the broker
   comes back and the queue is drained (PUBACK + delete) — messages/s, side by side for
   several in-flight windows.
3. Agent telemetry CPU: one AgentLink at a 5 s interval in its own process, reporting the real
   ``edgesdk.agent.metrics.Metrics`` of a real ONNX model (from a real bundle) that a thread
   keeps inferring; CPU of the link's threads (and of the whole process) over
   ``--agent-duration`` seconds.

    .venv/bin/python benchmarks/bench_mqtt.py                 # full run (~5 min)
    .venv/bin/python benchmarks/bench_mqtt.py --quick         # smoke run (~40 s)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto
from edgesdk.mqtt.client import ClientOptions, MqttClient, NetworkLoop
from edgesdk.mqtt.forwarder import QueueForwarder
from edgesdk.mqtt.queue import MessageQueue

NAMESPACE = "bench"
# A realistic telemetry body (~600 bytes, like a Telemetry JSON with two variants and sensors).
PAD = json.dumps(
    {
        "latency": {v: {"count": 120, "p50_ms": 1.234, "p95_ms": 2.345, "p99_ms": 3.456} for v in ("fp32", "int8")},
        "temperatures_c": {"cpu": 61.2, "gpu": 58.0, "soc": 60.1},
        "errors": {"bad_input": 1},
        "model": {"name": "digits", "version": "1.0.0", "release": 1, "variant": "int8", "sha256": "a" * 64},
    }
)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


# -- observer process ---------------------------------------------------------------------------
def observer_main(broker_url: str, conn: Any) -> None:
    """Subscribe to every device's telemetry; report counts and latencies when asked."""
    seen: dict[int, set[int]] = {}
    latencies: list[float] = []
    stats = {"messages": 0, "duplicates": 0}

    def on_message(topic: str, payload: bytes) -> None:
        now = time.time()
        data = json.loads(payload)
        stats["messages"] += 1
        seqs = seen.setdefault(data["d"], set())
        if data["s"] in seqs:
            stats["duplicates"] += 1
            return
        seqs.add(data["s"])
        latencies.append(now - data["t"])

    client = MqttClient(
        ClientOptions(client_id=f"observer-{os.getpid()}", broker_url=broker_url, max_inflight=1000, keepalive_s=60)
    )
    client.on_message = on_message
    client.subscribe(f"{NAMESPACE}/devices/+/telemetry", qos=1)
    client.start()
    conn.send(client.wait_connected(20))
    while True:
        command = conn.recv()
        if command == "stop":
            break
        if command == "reset":
            seen.clear()
            latencies.clear()
            stats.update(messages=0, duplicates=0)
            conn.send(True)
        elif command == "connects":
            conn.send(client.stats.connects if client.connected else 0)
        elif command == "count":
            conn.send(sum(len(s) for s in seen.values()))
        elif command == "report":
            lat = sorted(latencies)
            conn.send(
                {
                    "unique": sum(len(s) for s in seen.values()),
                    **stats,
                    "p50_s": lat[len(lat) // 2] if lat else None,
                    "p95_s": lat[int(len(lat) * 0.95)] if lat else None,
                    "max_s": lat[-1] if lat else None,
                }
            )
    client.stop()


class Observer:
    def __init__(self, broker_url: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=observer_main, args=(broker_url, child), daemon=True)
        self.proc.start()
        if not self.conn.recv():
            raise RuntimeError("observer could not connect")
        self.ps = psutil.Process(self.proc.pid)

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send("stop")
        self.proc.join(10)


# -- simulated devices --------------------------------------------------------------------------
class SimDevice:
    def __init__(self, index: int, broker_url: str, loop: NetworkLoop, db_dir: Path, window: int = 64) -> None:
        self.index = index
        self.topic = f"{NAMESPACE}/devices/sim-{index:05d}/telemetry"
        self.queue = MessageQueue(db_dir / f"sim-{index:05d}.sqlite3", durability="normal")
        self.client = MqttClient(
            ClientOptions(
                client_id=f"sim-{index:05d}", broker_url=broker_url, keepalive_s=60, max_inflight=max(window, 1)
            ),
            loop=loop,
        )
        self.forwarder = QueueForwarder(self.queue, self.client, window=window)
        self.seq = 0

    def send(self) -> None:
        payload = f'{{"d":{self.index},"s":{self.seq},"t":{time.time():.6f},"pad":{PAD}}}'.encode()
        self.queue.enqueue(self.topic, payload)
        self.seq += 1
        self.forwarder.pump()


def run_scale_step(n: int, duration: float, tmp: Path, db_root: Path) -> dict[str, Any]:
    with MosquittoBroker(data_dir=tmp / f"broker-{n}", persistence=False) as broker:
        observer = Observer(broker.url)
        loop = NetworkLoop(name="sim-loop").start()
        devices = [SimDevice(i, broker.url, loop, db_root / f"dbs-{n}") for i in range(n)]
        for device in devices:
            device.client.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(d.client.connected for d in devices):
            time.sleep(0.1)
        connected = sum(d.client.connected for d in devices)
        me = psutil.Process()
        broker_ps = psutil.Process(broker.pid)
        c0, b0, o0, t0 = cpu_seconds(me), cpu_seconds(broker_ps), cpu_seconds(observer.ps), time.monotonic()
        max_depth = 0
        # Device i sends at t0 + i/n + k: the load is spread evenly over each second.
        slot = 0.02
        k = 0
        start = time.monotonic()
        while time.monotonic() - start < duration:
            second_start = start + k
            for offset in range(0, n, max(1, int(n * slot))):
                at = second_start + offset / n
                pause = at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                for device in devices[offset : offset + max(1, int(n * slot))]:
                    device.send()
            max_depth = max(max_depth, sum(d.queue.depth for d in devices))
            k += 1
        sent_wall = time.monotonic() - t0
        c1, b1, o1 = cpu_seconds(me), cpu_seconds(broker_ps), cpu_seconds(observer.ps)
        expected = sum(d.seq for d in devices)
        drain_deadline = time.monotonic() + 30
        while time.monotonic() < drain_deadline and observer.ask("count") < expected:
            time.sleep(0.2)
        report = observer.ask("report")
        left = sum(d.queue.depth for d in devices)
        for device in devices:
            device.client.stop(timeout=0.2)
            device.queue.close()
        loop.stop()
        observer.stop()
    lost = expected - report["unique"]
    return {
        "devices": n,
        "connected": connected,
        "sent": expected,
        "received_unique": report["unique"],
        "lost": lost,
        "duplicates": report["duplicates"],
        "left_in_queues": left,
        "max_queue_depth_sum": max_depth,
        "p50_latency_ms": round(report["p50_s"] * 1000, 1) if report["p50_s"] is not None else None,
        "p95_latency_ms": round(report["p95_s"] * 1000, 1) if report["p95_s"] is not None else None,
        "broker_cpu_pct": round((b1 - b0) / sent_wall * 100, 1),
        "client_cpu_pct": round((c1 - c0) / sent_wall * 100, 1),
        "observer_cpu_pct": round((o1 - o0) / sent_wall * 100, 1),
        "held": lost == 0 and connected == n and (report["p95_s"] or 0) < 1.0,
    }


def run_drain(messages: int, window: int, tmp: Path) -> dict[str, Any]:
    with MosquittoBroker(data_dir=tmp / f"drain-broker-{window}", persistence=False) as broker:
        observer = Observer(broker.url)
        broker.stop()
        # Filling is set-up, not the measurement: skip the per-message fsync while filling, then
        # drain through a queue opened with the agent's default durability.
        filling = MessageQueue(tmp / f"drain-{window}.sqlite3", durability="normal")
        topic = f"{NAMESPACE}/devices/drain/telemetry"
        for seq in range(messages):
            filling.enqueue(topic, f'{{"d":0,"s":{seq},"t":{time.time():.6f},"pad":{PAD}}}'.encode())
        filling.close()
        queue = MessageQueue(tmp / f"drain-{window}.sqlite3")
        broker.start()
        # The observer must be back (and subscribed) before the device drains, or it misses messages.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and observer.ask("connects") < 2:
            time.sleep(0.05)
        time.sleep(0.3)
        observer.ask("reset")
        client = MqttClient(
            ClientOptions(client_id="drain", broker_url=broker.url, max_inflight=window, keepalive_s=60)
        )
        forwarder = QueueForwarder(queue, client, window=window)
        me = psutil.Process()
        c0 = cpu_seconds(me)
        t0 = time.monotonic()  # includes the connect: the figure is what a device sees
        client.start()
        while queue.depth and time.monotonic() - t0 < 120:
            time.sleep(0.002)
        drained_s = time.monotonic() - t0
        c1 = cpu_seconds(me)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and observer.ask("count") < messages:
            time.sleep(0.1)
        report = observer.ask("report")
        client.stop()
        queue.close()
        observer.stop()
    return {
        "window": window,
        "messages": messages,
        "drain_s": round(drained_s, 2),
        "rate_msg_s": round(messages / drained_s),
        "client_cpu_pct": round((c1 - c0) / drained_s * 100, 1),
        "received_unique": report["unique"],
        "duplicates": report["duplicates"],
        "sent_acked": forwarder.delivered,
    }


def _served_model(root: Path, events: Any) -> tuple[Any, Any]:
    """A ModelServer serving a real ONNX model (bench_ota's MLP on the digits input, ~1 MB)
    from a real bundle, with the agent's Metrics wired to it as the daemon wires them."""
    import importlib.util

    from edgesdk.agent.metrics import Metrics
    from edgesdk.agent.serving import ModelServer

    from edgesdk.bundle import package_bundle, verify_bundle
    from edgesdk.keys import load_device_private_key, load_publisher_public_key

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/ helpers
    from tests.bundle_helpers import make_keys, write_convert_dir

    spec = importlib.util.spec_from_file_location("bench_ota", Path(__file__).with_name("bench_ota.py"))
    assert spec is not None and spec.loader is not None
    bench_ota = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_ota)
    keys = make_keys(root / "keys")
    model = bench_ota.wide_mlp_onnx(4096, seed=1)
    convert = write_convert_dir(
        root / "convert", {"onnx-fp32": {"model.onnx": model}}, golden=bench_ota.golden_for(model)
    )
    bundle = package_bundle(
        convert, name="digits", version="1.0.0", release=1, publisher_key=keys.publisher_key,
        recipients=[keys.device_pub], out=root / "model.edgepkg",
    )  # fmt: skip
    server = ModelServer(events=events)
    metrics = Metrics(server)
    server.observe, server.count_error = metrics.observe, metrics.count_error
    verified = verify_bundle(bundle, trusted_publishers=[load_publisher_public_key(keys.publisher_pub)])
    server.swap(verified, load_device_private_key(keys.device_key))
    return server, metrics


def agent_link_main(broker_url: str, data_dir: str, interval: float, duration: float, conn: Any) -> None:
    """One AgentLink reporting the real agent Metrics of a model under steady inference
    traffic, in this process. The figure is the CPU of the link's own threads (telemetry
    snapshot + JSON + SQLite outbox, inbox, MQTT network loop); the process total, mostly
    inference, is reported beside it."""
    import threading

    import numpy as np
    from edgesdk.agent.events import EventBus

    from edgesdk.schemas.agent_config import AgentConfig
    from tests.agent_wiring_helpers import start_link

    events = EventBus()
    server, metrics = _served_model(Path(data_dir) / "model", events)

    class Agent:
        def __init__(self) -> None:
            self.config = AgentConfig(
                device_id="bench-agent",
                profile="rpi5-8gb",
                data_dir=Path(data_dir),
                mqtt={"enabled": True, "broker": broker_url, "telemetry_interval_s": interval},
            )
            self.metrics = metrics
            self.events = events
            self.device_key = None

    stop = threading.Event()
    inferences = [0]

    def traffic() -> None:
        image = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)
        while not stop.is_set():
            server.infer("digits", {"image": image})
            inferences[0] += 1
            time.sleep(0.005)  # steady load (~150-200 requests/s), not a CPU-bound spin

    worker = threading.Thread(target=traffic, name="bench-traffic", daemon=True)
    worker.start()
    link = start_link(Agent())
    link.client.wait_connected(20)
    time.sleep(1.0)  # start-up (imports, first report) is not steady state
    link_threads = {t.native_id for t in threading.enumerate() if t.name.startswith("mqtt")}
    me = psutil.Process()

    def link_cpu() -> float:
        return sum(t.user_time + t.system_time for t in me.threads() if t.id in link_threads)

    c0, l0, n0, t0 = cpu_seconds(me), link_cpu(), inferences[0], time.monotonic()
    time.sleep(duration)
    c1, l1, n1, t1 = cpu_seconds(me), link_cpu(), inferences[0], time.monotonic()
    sent = link.forwarder.delivered
    snapshot = metrics.snapshot()
    link.stop()
    stop.set()
    worker.join()
    conn.send(
        {
            "link_cpu_pct": round((l1 - l0) / (t1 - t0) * 100, 3),
            "link_cpu_s": round(l1 - l0, 3),
            "link_threads": len(link_threads),
            "process_cpu_pct": round((c1 - c0) / (t1 - t0) * 100, 1),
            "inferences_per_s": round((n1 - n0) / (t1 - t0), 1),
            "reported_variants": sorted(snapshot["latency"]),
            "delivered": sent,
        }
    )


def run_agent_cpu(interval: float, duration: float, tmp: Path) -> dict[str, Any]:
    with MosquittoBroker(data_dir=tmp / "agent-broker", persistence=False) as broker:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=agent_link_main, args=(broker.url, str(tmp / "agent"), interval, duration, child))
        proc.start()
        result = parent.recv()
        proc.join(30)
    return {"interval_s": interval, "duration_s": duration, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="250,500,1000,1500", help="device counts to try, in order")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each scale step runs")
    parser.add_argument("--drain-messages", type=int, default=20000)
    parser.add_argument("--windows", default="16,64,256", help="in-flight windows for the drain test")
    parser.add_argument("--agent-duration", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="small, short run to check the harness")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: scale,drain,agent")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--db-dir",
        type=Path,
        help="where the simulated devices' queue files go (default: a temp dir on the normal disk)",
    )
    args = parser.parse_args()
    if find_mosquitto() is None:
        print("mosquitto is not installed (apt-get install mosquitto)", file=sys.stderr)
        return 2
    if args.quick:
        args.steps, args.duration, args.drain_messages, args.agent_duration = "50,100", 5.0, 2000, 10.0
    skip = set(filter(None, args.skip.split(",")))
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as tmp_name:
        tmp = Path(tmp_name)
        if "scale" not in skip:
            print(f"== telemetry scale: 1 msg/s per device, {args.duration:g} s per step")
            print(
                f"{'N':>6} {'sent':>8} {'lost':>5} {'dup':>5} {'p50 ms':>8} {'p95 ms':>8} "
                f"{'broker%':>8} {'client%':>8} {'observer%':>9} held"
            )
            results["scale"] = []
            for n in [int(x) for x in args.steps.split(",")]:
                db_root = Path(tempfile.mkdtemp(prefix="bench-mqtt-dbs-", dir=args.db_dir)) if args.db_dir else tmp
                r = run_scale_step(n, args.duration, tmp, db_root)
                if args.db_dir:
                    shutil.rmtree(db_root, ignore_errors=True)
                results["scale"].append(r)
                print(
                    f"{n:>6} {r['sent']:>8} {r['lost']:>5} {r['duplicates']:>5} {r['p50_latency_ms']!s:>8} "
                    f"{r['p95_latency_ms']!s:>8} {r['broker_cpu_pct']:>8} {r['client_cpu_pct']:>8} "
                    f"{r['observer_cpu_pct']:>9} {'yes' if r['held'] else 'NO'}",
                    flush=True,
                )
                if not r["held"]:
                    break
            held = [r["devices"] for r in results["scale"] if r["held"]]
            results["largest_n_held"] = max(held) if held else 0
            print(f"largest N held with zero loss: {results['largest_n_held']}")
        if "drain" not in skip:
            print(f"== drain after an outage: {args.drain_messages} queued messages")
            results["drain"] = []
            for window in [int(x) for x in args.windows.split(",")]:
                r = run_drain(args.drain_messages, window, tmp)
                results["drain"].append(r)
                print(
                    f"window {window:>4}: {r['rate_msg_s']:>6} msg/s ({r['drain_s']} s, client CPU "
                    f"{r['client_cpu_pct']}%, received {r['received_unique']}/{r['messages']}, "
                    f"dup {r['duplicates']})",
                    flush=True,
                )
        if "agent" not in skip:
            print(f"== one AgentLink at a 5 s interval, model under traffic, for {args.agent_duration:g} s")
            r = run_agent_cpu(5.0, args.agent_duration, tmp)
            results["agent"] = r
            print(
                f"link threads CPU: {r['link_cpu_pct']}% of one core ({r['link_cpu_s']} s CPU, "
                f"{r['delivered']} reports of {r['reported_variants']}); whole process {r['process_cpu_pct']}% "
                f"at {r['inferences_per_s']} inferences/s"
            )
    results["load_avg_end"] = os.getloadavg()
    print(f"load average start {results['load_avg_start']} end {results['load_avg_end']} (shared machine)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
