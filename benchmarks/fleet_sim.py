"""A fleet simulator that is not the bottleneck, and the fleet-at-scale benchmarks (issue 20).

``--devices`` simulated devices spread over ``--processes`` simulator processes. Every device
is a real ``edgesdk.agent.link.AgentLink`` — the agent's own presence (retained, with its Last
Will), ``telemetry_payload`` and the SQLite store-and-forward outbox (``MessageQueue`` +
``QueueForwarder``, outbox files on tmpfs) — with the links of one process sharing one
``NetworkLoop`` thread; a scheduler has each link's ``send_telemetry`` called every ``--interval``
seconds, the devices' phases spread evenly over the interval (due reports are handed to the
network loop's thread in small batches, every 20 ms at most). They talk to one mosquitto;
``edgesdk fleet serve --workers W`` ingests into a throwaway PostgreSQL.

1. **telemetry** (``--steps``): for each fleet size, a fresh broker, database and service; all
   devices connect (time reported), a warm-up interval, then ``--duration`` seconds measured.
   End-to-end latency = when the row was written in PostgreSQL (a ``stored_at`` column the
   benchmark adds to its throwaway database, default ``clock_timestamp()``: the insert's time,
   a few ms before its commit) minus the report's ``ts`` (set when the device built it).
   Lost = reports the devices enqueued minus distinct rows stored after the outboxes drained.
   CPU per component (broker, service + workers, PostgreSQL, simulators) as % of one
   core over the measured window: what saturates first.
2. **ingest** (``--ingest-workers 1,2,4``): raw ingest throughput per worker count, rounds
   interleaved (1,2,4 then 4,2,1): publisher processes offer ``--ingest-messages`` telemetry
   reports as fast as the broker takes them; rate = rows stored per second from the first row
   to the last. Offered rate reported beside it (if it is lower, the figure is a floor).

    .venv/bin/python benchmarks/fleet_sim.py --steps 2000,5000,10000            # ~15 min
    .venv/bin/python benchmarks/fleet_sim.py --skip telemetry --ingest-workers 1,2,4
    .venv/bin/python benchmarks/fleet_sim.py --quick                              # smoke (~2 min)
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from edgesdk.keys import generate_publisher_key  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402

MODEL = {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "a" * 64}


class _Snapshot:
    """A device's metrics as the agent's ``Metrics.snapshot()`` shapes them (~600 bytes of JSON)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def snapshot(self) -> dict[str, Any]:
        p50 = 1.0 + self.rng.random()
        return {
            "model": MODEL,
            "latency": {"onnx-fp32": {"count": 120, "p50_ms": p50, "p95_ms": p50 * 2, "p99_ms": p50 * 3}},
            "throughput_rps": 12.0,
            "errors": {},
            "temperatures_c": {"cpu": 50.0 + 10 * self.rng.random(), "soc": 52.0},
            "cpu_percent": 12.5,
            "rss_mb": 140.0,
            "power_source": "ac",
            "governor_state": "NOMINAL",
        }


# -- a simulator process ------------------------------------------------------------------------
def sim_main(index: int, broker_url: str, devices: list[str], root: str, interval: float, conn: Any) -> None:
    """Run ``devices`` as AgentLinks on one network loop; answer the orchestrator's commands."""
    import logging

    from edgesdk.agent.link import AgentLink

    from edgesdk.mqtt.client import NetworkLoop
    from edgesdk.schemas.agent_config import AgentConfig

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("edgesdk").setLevel(logging.ERROR)  # 'connected' per device is noise here
    rng = random.Random(index)
    loop = NetworkLoop(name=f"sim-{index}").start()
    links = []
    for device in devices:
        config = AgentConfig(
            device_id=device,
            profile="rpi5-8gb",
            data_dir=Path(root) / device,
            mqtt={"enabled": True, "broker": broker_url, "telemetry_interval_s": interval, "keepalive_s": 60},
        )
        link = AgentLink(config, telemetry=_Snapshot(rng), loop=loop)
        link.client.start()  # the link's own telemetry thread is replaced by the scheduler below
        links.append(link)
    sending = threading.Event()
    stopping = threading.Event()
    sent = [0]
    late: list[float] = []

    def send(batch: list[tuple[float, int]]) -> None:
        # On the network loop's thread: send_telemetry's pump publishes inline, with no wake-up
        # of the loop and no hand-over of the GIL per report (measured: 0.54 ms of simulator CPU
        # per report instead of 0.94). The link code is the agent's; only who calls it differs
        # (a device's own telemetry thread calls it once per interval).
        for at, i in batch:
            late.append(time.monotonic() - at)
            links[i].send_telemetry()
        sent[0] += len(batch)

    def scheduler() -> None:
        start = time.monotonic()
        due = [(start + interval * (i / len(links)), i) for i in range(len(links))]
        heapq.heapify(due)
        while not stopping.is_set():
            now = time.monotonic()
            batch: list[tuple[float, int]] = []
            while due[0][0] <= now:
                at, i = due[0]
                heapq.heapreplace(due, (at + interval, i))
                batch.append((at, i))
            if batch and sending.is_set():
                loop.call(lambda batch=batch: send(batch))
            stopping.wait(min(max(due[0][0] - time.monotonic(), 0.0), 0.02))

    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    while True:
        command = conn.recv()
        if command == "connected":
            conn.send(sum(1 for link in links if link.client.connected))
        elif command == "send":
            sending.set()
            conn.send(True)
        elif command == "pause":
            sending.clear()
            conn.send(True)
        elif command == "stats":
            depth = sum(link.queue.depth for link in links)
            lag = sorted(late)
            conn.send(
                {
                    "sent": sent[0],
                    "outbox": depth,
                    "scheduler_lag_p95_s": lag[int(0.95 * (len(lag) - 1))] if lag else 0.0,
                }
            )
        elif command == "stop":
            stopping.set()
            for link in links:
                link.client.stop(graceful=False)
                link.queue.close()
            loop.stop()
            conn.send(True)
            return


# -- a raw publisher (ingest throughput) --------------------------------------------------------
def publisher_main(broker_url: str, index: int, messages: int, devices: int, conn: Any) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient
    from edgesdk.schemas.messages import Telemetry

    client = MqttClient(
        ClientOptions(client_id=f"bench-pub-{index}", broker_url=broker_url, clean_start=True, max_inflight=1000)
    )
    client.start()
    client.wait_connected(30)
    snapshot = _Snapshot(random.Random(index)).snapshot()
    payloads = []
    for n in range(messages):
        device = f"pub{index}-{n % devices:04d}"
        report = Telemetry(device_id=device, msg_id=f"{device}-{n}", seq=n, ts=datetime.now(timezone.utc), **snapshot)
        payloads.append((f"edgesdk/devices/{device}/telemetry", report.model_dump_json().encode()))
    conn.send("ready")
    conn.recv()
    start = time.monotonic()
    for topic, payload in payloads:
        client.publish(topic, payload, qos=1)
    deadline = time.monotonic() + 300
    while client.stats.acked < messages and time.monotonic() < deadline:
        time.sleep(0.01)
    conn.send({"acked": client.stats.acked, "seconds": time.monotonic() - start})
    client.stop()


# -- orchestration ------------------------------------------------------------------------------
class Stack:
    """mosquitto + a fresh database + ``edgesdk fleet serve --workers W``."""

    def __init__(self, root: Path, cluster: Any, key: Path, workers: int, name: str) -> None:
        self.root = root / name
        self.root.mkdir(parents=True)
        self.broker = MosquittoBroker(
            data_dir=self.root / "mosquitto", persistence=False, max_queued_messages=1_000_000
        )
        self.broker.start()
        self.db_url = cluster.create_database(name)
        argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", self.broker.url]
        argv += ["--db", self.db_url, "--operator-key", str(key), "--data-dir", str(self.root)]
        argv += ["--maintenance-interval", "24h", "--workers", str(workers)]
        self.log = self.root / "serve.log"
        self.service = subprocess.Popen(argv, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
        ready = "fleet service on" if workers == 0 else "ingest worker"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if text.count(ready) >= (1 if workers == 0 else 2 * workers):  # 'started' + 'on' per worker
                break
            if self.service.poll() is not None:
                raise SystemExit(f"fleet serve exited:\n{text[-3000:]}")
            time.sleep(0.2)
        time.sleep(1.0)
        self._sql(
            "ALTER TABLE telemetry ADD COLUMN stored_at double precision DEFAULT extract(epoch from clock_timestamp())"
        )

    def _sql(self, statement: str, **params: Any) -> list[Any]:
        import sqlalchemy as sa

        from edgesdk.fleet.service.database import open_engine

        engine = open_engine(self.db_url)
        try:
            with engine.begin() as db:
                result = db.execute(sa.text(statement), params)
                return list(result.all()) if result.returns_rows else []
        finally:
            engine.dispose()

    def latencies(self, start: float, end: float) -> list[float]:
        """Seconds from each report's ``ts`` to its row's insert, for reports built in [start, end)."""
        rows = self._sql("SELECT stored_at - ts FROM telemetry WHERE ts >= :a AND ts < :b", a=start, b=end)
        return [float(r[0]) for r in rows]

    def rows(self) -> int:
        import sqlalchemy as sa

        from edgesdk.fleet.service import schema
        from edgesdk.fleet.service.database import open_engine

        engine = open_engine(self.db_url)
        try:
            with engine.connect() as db:
                query = sa.select(sa.func.count(sa.distinct(schema.telemetry.c.msg_id)))
                return int(db.execute(query).scalar() or 0)
        finally:
            engine.dispose()

    def stop(self) -> None:
        self.service.send_signal(signal.SIGTERM)
        try:
            self.service.wait(60)
        except subprocess.TimeoutExpired:
            self.service.kill()
        self.broker.close()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def telemetry_step(n: int, args: argparse.Namespace, root: Path, cluster: Any, key: Path) -> dict[str, Any]:
    stack = Stack(root, cluster, key, args.serve_workers, f"telemetry_{n}")
    outboxes = Path(tempfile.mkdtemp(prefix=f"fleet-sim-{n}-", dir="/dev/shm"))
    ctx = mp.get_context("spawn")
    per = [list(range(n))[i :: args.processes] for i in range(args.processes)]
    sims = []
    for i, indices in enumerate(per):
        parent, child = ctx.Pipe()
        devices = [f"sim-{d:05d}" for d in indices]
        proc = ctx.Process(target=sim_main, args=(i, stack.broker.url, devices, str(outboxes), args.interval, child))
        proc.start()
        sims.append((proc, parent))
    result: dict[str, Any] = {"devices": n, "processes": args.processes, "workers": args.serve_workers}
    try:
        t0 = time.monotonic()
        connected = 0
        while time.monotonic() - t0 < args.connect_timeout:
            for _, pipe in sims:
                pipe.send("connected")
            connected = sum(pipe.recv() for _, pipe in sims)
            if connected == n:
                break
            time.sleep(1.0)
        result["connected"] = connected
        result["connect_s"] = round(time.monotonic() - t0, 1)
        for _, pipe in sims:
            pipe.send("send")
            pipe.recv()
        time.sleep(args.interval)  # warm-up: every device reported once
        groups = {
            "broker": _tree(stack.broker.pid or 0),
            "service+workers": _tree(stack.service.pid),
            "postgresql": [p for p in psutil.process_iter() if p.name().startswith("postgres")],
            "simulators": [psutil.Process(p.pid) for p, _ in sims],
        }
        before = {k: _cpu(v) for k, v in groups.items()}
        w0, wall0 = time.monotonic(), time.time()
        time.sleep(args.duration)
        window, wall1 = time.monotonic() - w0, time.time()
        after = {k: _cpu(v) for k, v in groups.items()}
        for _, pipe in sims:
            pipe.send("pause")
            pipe.recv()
        stats: list[dict[str, Any]] = []
        # Wait for the backlog (outboxes, the broker's queues) to be stored: as long as rows keep
        # coming, up to --grace seconds without progress; only what never arrives is lost.
        paused = time.monotonic()
        last_progress, last_stored = paused, -1
        while True:
            for _, pipe in sims:
                pipe.send("stats")
            stats = [pipe.recv() for _, pipe in sims]
            sent = sum(s["sent"] for s in stats)
            stored = stack.rows()
            if stored > last_stored:
                last_progress, last_stored = time.monotonic(), stored
            if stored >= sent and sum(s["outbox"] for s in stats) == 0:
                break
            if time.monotonic() - last_progress > args.grace or time.monotonic() - paused > args.drain_max:
                break
            time.sleep(1.0)
        result["backlog_drain_s"] = round(time.monotonic() - paused, 1)
        latencies = stack.latencies(wall0, wall1)
        result.update(
            {
                "window_s": round(window, 1),
                "reports_sent": sent,
                "stored": stored,
                "lost": sent - stored,
                "outbox_left": sum(s["outbox"] for s in stats),
                "rate_msg_s": round(len(latencies) / window, 1),
                "e2e_p50_s": _round(_percentile(latencies, 0.50)),
                "e2e_p95_s": _round(_percentile(latencies, 0.95)),
                "e2e_max_s": _round(max(latencies) if latencies else None),
                "scheduler_lag_p95_s": _round(max(s["scheduler_lag_p95_s"] for s in stats)),
                "cpu_pct_of_one_core": {k: round(100 * (after[k] - before[k]) / window, 1) for k in groups},
                "load_average": os.getloadavg(),
            }
        )
    finally:
        for proc, pipe in sims:
            try:
                pipe.send("stop")
                pipe.recv()
            except (EOFError, OSError):
                pass
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        stack.stop()
        shutil.rmtree(outboxes, ignore_errors=True)
    return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def ingest_round(
    workers: int, args: argparse.Namespace, root: Path, cluster: Any, key: Path, tag: str
) -> dict[str, Any]:
    stack = Stack(root, cluster, key, workers, f"ingest_w{workers}_{tag}")
    ctx = mp.get_context("spawn")
    per = args.ingest_messages // args.publishers
    pubs = []
    try:
        for i in range(args.publishers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=publisher_main, args=(stack.broker.url, i, per, 200, child))
            proc.start()
            pubs.append((proc, parent))
        for _, pipe in pubs:
            assert pipe.recv() == "ready"
        service = _tree(stack.service.pid)
        cpu0 = _cpu(service)
        for _, pipe in pubs:
            pipe.send("go")
        start = time.monotonic()
        total = per * args.publishers
        first_at = None
        stored = 0
        while time.monotonic() - start < 600:
            stored = stack.rows()
            if stored and first_at is None:
                first_at = time.monotonic()
            if stored >= total:
                break
            time.sleep(0.1)
        done = time.monotonic()
        offered = [pipe.recv() for _, pipe in pubs]
        seconds = done - (first_at or start)
        return {
            "workers": workers,
            "messages": total,
            "stored": stored,
            "ingest_msg_s": round(stored / seconds, 1) if seconds > 0 else None,
            "offered_msg_s": round(total / max(o["seconds"] for o in offered), 1),
            "service_cpu_pct": round(100 * (_cpu(service) - cpu0) / max(done - start, 1e-9), 1),
            "load_average": os.getloadavg(),
        }
    finally:
        for proc, _ in pubs:
            proc.join(30)
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="2000,5000,10000", help="fleet sizes for the telemetry part")
    parser.add_argument("--processes", type=int, default=4, help="simulator processes")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between a device's reports")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per step")
    parser.add_argument(
        "--grace", type=float, default=30.0, help="stop waiting for the backlog after this long without progress"
    )
    parser.add_argument("--drain-max", type=float, default=900.0, help="longest wait for the backlog to be stored")
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    parser.add_argument("--serve-workers", type=int, default=2, help="ingest workers in the telemetry part")
    parser.add_argument("--ingest-workers", default="1,2,4")
    parser.add_argument("--ingest-messages", type=int, default=20000)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--skip", default="", help="telemetry and/or ingest")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.duration, args.interval, args.ingest_messages = "500", 15.0, 5.0, 4000
    from tests.pg_helpers import PostgresCluster, find_pg_bin

    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL server binaries not installed (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-sim-"))
    key, _ = generate_publisher_key(root / "operator")
    cluster = PostgresCluster(bin_dir).start()
    results: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_before": os.getloadavg()}
    try:
        if "telemetry" not in args.skip:
            results["telemetry"] = []
            for n in [int(s) for s in args.steps.split(",")]:
                print(f"== telemetry: {n} devices, one report per {args.interval:g} s", flush=True)
                step = telemetry_step(n, args, root, cluster, key)
                print(json.dumps(step), flush=True)
                results["telemetry"].append(step)
        if "ingest" not in args.skip:
            counts = [int(w) for w in args.ingest_workers.split(",")]
            results["ingest"] = []
            for tag, order in (("a", counts), ("b", list(reversed(counts)))):
                for workers in order:
                    print(f"== ingest throughput: {workers} worker(s), round {tag}", flush=True)
                    one = ingest_round(workers, args, root, cluster, key, tag)
                    print(json.dumps(one), flush=True)
                    results["ingest"].append(one)
            by = {w: statistics.mean(r["ingest_msg_s"] for r in results["ingest"] if r["workers"] == w) for w in counts}
            results["ingest_ratio_vs_1"] = {w: round(v / by[counts[0]], 2) for w, v in by.items()}
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
