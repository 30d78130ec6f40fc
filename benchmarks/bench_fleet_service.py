"""Fleet service benchmarks (issue 19), figures printed; results in BENCHMARKS.md.

1. Telemetry ingest, sustained with zero loss, into SQLite and into PostgreSQL: ONE
   ``edgesdk fleet serve`` process against one local mosquitto; a publisher process with
   ``--devices`` simulated devices (real ``MqttClient``s, QoS 1) offers valid ``Telemetry``
   messages at a fixed total rate for ``--seconds``; the rate steps up until a step fails.
   A step passes when every message is in the ``telemetry`` table (unique ``msg_id``) within
   ``--grace`` seconds of the last publish. Reported per step: offered and achieved rates,
   rows written, lost, backlog drain time, the service's CPU (% of one core).
2. Dashboard API latency with ``--fleet`` devices and a day of telemetry (one report per
   device per minute: 1,440 rows per device, then per-minute aggregates by the service's own
   downsampling pass), on each database: the service process with ``--api``; ``--requests``
   sequential requests (one kept-alive connection) to each route behind the dashboard's
   pages; p50/p95/max per route.

    .venv/bin/python benchmarks/bench_fleet_service.py                 # both parts, both databases
    .venv/bin/python benchmarks/bench_fleet_service.py --quick         # smoke run
    .venv/bin/python benchmarks/bench_fleet_service.py --skip dashboard --rates 500,1000,2000
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.keys import generate_publisher_key  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402

MODEL = {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "a" * 64}


def telemetry(device: str, seq: int, ts: float) -> bytes:
    return json.dumps(
        {
            "device_id": device,
            "msg_id": uuid.uuid4().hex,
            "seq": seq,
            "ts": datetime.fromtimestamp(ts, timezone.utc).isoformat(),
            "model": MODEL,
            "latency": {"onnx-fp32": {"count": 120, "p50_ms": 1.2, "p95_ms": 2.3 + (seq % 7) / 10, "p99_ms": 3.4}},
            "throughput_rps": 12.0,
            "temperatures_c": {"cpu": 55.0 + seq % 5, "soc": 52.0},
            "queue_depth": 0,
            "outbox_depth": 0,
            "cpu_percent": 12.5,
            "rss_mb": 140.0,
            "power_source": "ac",
            "governor_state": "NOMINAL",
        }
    ).encode()


# -- the publisher process ----------------------------------------------------------------------
def publisher_main(broker_url: str, devices: int, rate: float, seconds: float, out: Any) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    clients = []
    for i in range(devices):
        options = ClientOptions(client_id=f"bench-dev-{i}", broker_url=broker_url, clean_start=True, max_inflight=1000)
        client = MqttClient(options)
        client.start()
        clients.append(client)
    for client in clients:
        client.wait_connected(30)
    total = int(rate * seconds)
    start = time.monotonic()
    seq = [0] * devices
    for n in range(total):
        due = start + n / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        i = n % devices
        clients[i].publish(
            f"edgesdk/devices/bench-dev-{i}/telemetry", telemetry(f"bench-dev-{i}", seq[i], time.time()), qos=1
        )
        seq[i] += 1
    published_at = time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(c.stats.acked for c in clients) < total:
        time.sleep(0.05)
    out.send({"sent": total, "acked": sum(c.stats.acked for c in clients), "publish_s": published_at - start})
    for client in clients:
        client.stop()


def count_rows(engine: Any) -> int:
    import sqlalchemy as sa

    with engine.connect() as db:
        return int(db.execute(sa.select(sa.func.count()).select_from(schema.telemetry)).scalar() or 0)


def start_service(
    db_url: str, broker_url: str, key: Path, root: Path, api: bool = False
) -> tuple[subprocess.Popen[bytes], int | None]:
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", broker_url, "--db", db_url]
    argv += ["--operator-key", str(key), "--data-dir", str(root), "--maintenance-interval", "24h"]
    port = None
    if api:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        argv += ["--api", f"127.0.0.1:{port}"]
    log = open(root / f"service-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ready = connected and subscribed: its session exists
        if api and port:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/login")
                break
            except OSError:
                time.sleep(0.2)
                continue
        time.sleep(3.0)
        break
    return proc, port


def ingest_steps(
    db_url: str, broker_url: str, key: Path, root: Path, rates: list[float], args: Any
) -> list[dict[str, Any]]:
    engine = open_engine(db_url)
    migrate(engine)
    proc, _ = start_service(db_url, broker_url, key, root)
    service = psutil.Process(proc.pid)
    time.sleep(2.0)
    results = []
    try:
        for rate in rates:
            before = count_rows(engine)
            cpu0 = sum(service.cpu_times()[:2])
            receiver, sender = mp.Pipe(duplex=False)
            publisher = mp.Process(target=publisher_main, args=(broker_url, args.devices, rate, args.seconds, sender))
            t0 = time.monotonic()
            publisher.start()
            report = receiver.recv()
            publisher.join(60)
            end_publish = t0 + report["publish_s"]
            expected = before + report["sent"]
            deadline = time.monotonic() + args.grace
            rows = count_rows(engine)
            while rows < expected and time.monotonic() < deadline:
                time.sleep(0.1)
                rows = count_rows(engine)
            done = time.monotonic()
            cpu = (sum(service.cpu_times()[:2]) - cpu0) / max(done - t0, 1e-9) * 100
            lost = expected - rows
            step = {
                "offered_per_s": rate,
                "sent": report["sent"],
                "acked_by_broker": report["acked"],
                "written": rows - before,
                "missing_after_grace": lost,
                # written / (publishing + the wait for the last row): the rate the ingest sustained
                "achieved_per_s": round(
                    (rows - before) / max(report["publish_s"] + max(0.0, done - end_publish), 1e-9), 1
                ),
                "drain_after_publish_s": round(max(0.0, done - end_publish), 2) if lost == 0 else None,
                "service_cpu_percent": round(cpu, 1),
                "kept_pace": lost == 0,
            }
            if lost:  # behind or lost? wait for the backlog to tell them apart
                deadline = time.monotonic() + 120
                while count_rows(engine) < expected and time.monotonic() < deadline:
                    time.sleep(0.5)
                step["eventually_written"] = count_rows(engine) - before
                step["eventually_after_s"] = round(time.monotonic() - end_publish, 1)
            print(json.dumps(step), flush=True)
            results.append(step)
            if lost:
                break
    finally:
        proc.terminate()
        proc.wait(30)
        engine.dispose()
    return results


# -- part 2: the dashboard's API on a day of telemetry ----------------------------------------
def populate(db_url: str, fleet: int, minutes: int) -> dict[str, Any]:
    import sqlalchemy as sa

    from edgesdk.fleet.service.retention import downsample

    engine = open_engine(db_url)
    migrate(engine)
    now = time.time()
    start = now - minutes * 60
    t0 = time.monotonic()
    with engine.begin() as db:
        db.execute(
            schema.devices.insert(),
            [
                {
                    "device_id": f"dev-{i:04d}",
                    "online": i % 50 != 0,
                    "groups": json.dumps([f"line-{i % 10}"]),
                    "model_name": "digits",
                    "model_version": "1.0.0" if i % 3 else "1.1.0",
                    "model_release": 1,
                    "variant": "onnx-fp32",
                    "model_sha256": "a" * 64,
                    "precision": "fp32",
                    "first_seen": start,
                    "last_seen": now,
                    "presence_ts": now,
                }
                for i in range(fleet)
            ],
        )
    batch: list[dict[str, Any]] = []
    for minute in range(minutes):
        ts = start + minute * 60
        for i in range(fleet):
            batch.append(
                {
                    "device_id": f"dev-{i:04d}",
                    "msg_id": f"{i}-{minute}",
                    "seq": minute,
                    "ts": ts + i % 60,
                    "model_version": "1.0.0",
                    "precision": "fp32",
                    "requests": 600,
                    "p50_ms": 1.2,
                    "p95_ms": 2.0 + (minute % 30) / 10,
                    "p99_ms": 3.5,
                    "throughput_rps": 10.0,
                    "errors": 0,
                    "temperature_c": 50.0 + (minute % 20),
                    "queue_depth": 0,
                    "outbox_depth": 0,
                    "dropped_messages": 0,
                    "governor_state": "NOMINAL",
                    "power_source": "ac",
                }
            )
        if len(batch) >= 20000:
            with engine.begin() as db:
                db.execute(schema.telemetry.insert(), batch)
            batch = []
    if batch:
        with engine.begin() as db:
            db.execute(schema.telemetry.insert(), batch)
    inserted_s = time.monotonic() - t0
    t1 = time.monotonic()
    aggregates = downsample(engine)
    downsample_s = time.monotonic() - t1
    # One rollout of the whole fleet, finished, for the rollout page.
    from edgesdk.fleet.service.store import SqlRolloutStore
    from tests.unit.test_fleet_service_store import _template

    store = SqlRolloutStore(engine)
    devices = [f"dev-{i:04d}" for i in range(fleet)]
    store.create(
        _template("bench-rollout").model_copy(update={"targets": devices}),
        REPO_ROOT / "README.md",
        {"canary": 0.1, "waves": [0.5, 1.0]},
        [devices[:100], devices[100:500], devices[500:]],
    )
    with engine.begin() as db:
        db.execute(schema.deployment_devices.update().values(state="COMMITTED"))
    with engine.connect() as db:
        rows = db.execute(sa.select(sa.func.count()).select_from(schema.telemetry)).scalar()
    engine.dispose()
    return {
        "telemetry_rows": rows,
        "insert_s": round(inserted_s, 1),
        "minute_aggregates": aggregates,
        "downsample_s": round(downsample_s, 1),
    }


def measure_routes(port: int, token: str, session: str, requests: int, fleet: int) -> dict[str, dict[str, float]]:
    one = f"dev-{fleet // 2:04d}"
    routes = {
        "overview page /": "/",
        f"device page /ui/devices/{one}": f"/ui/devices/{one}",
        f"rollout page ({fleet} devices)": "/ui/deployments/bench-rollout",
        f"GET /api/v1/devices ({fleet})": "/api/v1/devices",
        "GET /api/v1/devices?group=line-3": "/api/v1/devices?group=line-3",
        f"GET /api/v1/devices/{one}": f"/api/v1/devices/{one}",
        "history 24 h (minute aggregates)": f"/api/v1/devices/{one}/history?hours=24",
        "history 6 h (raw)": f"/api/v1/devices/{one}/history?hours=6",
        "GET /api/v1/deployments/bench-rollout": "/api/v1/deployments/bench-rollout",
        "GET /metrics": "/metrics",
    }
    results = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Cookie": f"edgesdk_fleet_session={session}"}
    for name, path in routes.items():
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            times.append((time.perf_counter() - t0) * 1000)
            if response.status != 200:
                raise RuntimeError(f"{path}: {response.status} {body[:200]!r}")
        times.sort()
        results[name] = {
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
            "max_ms": round(times[-1], 1),
            "bytes": len(body),
        }
        print(
            f"  {name:42s} p50 {results[name]['p50_ms']:8.1f} ms  p95 {results[name]['p95_ms']:8.1f} ms  ({len(body)} bytes)",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="250,500,1000,2000,4000")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--fleet", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=1440)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--skip", default="", help="ingest and/or dashboard")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rates, args.seconds, args.fleet, args.minutes, args.requests = "250,500", 4.0, 100, 120, 20
    from tests.pg_helpers import PostgresCluster, find_pg_bin

    root = Path(tempfile.mkdtemp(prefix="bench-fleet-service-"))
    key, _ = generate_publisher_key(root / "operator")
    broker = MosquittoBroker(data_dir=root / "mosquitto").start()
    cluster = None
    results: dict[str, Any] = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}

    def db_url(kind: str, name: str) -> str:
        nonlocal cluster
        if kind == "sqlite":
            return f"sqlite:///{root / name}.sqlite3"
        if cluster is None:
            bin_dir = find_pg_bin()
            if bin_dir is None:
                raise SystemExit("PostgreSQL server binaries not installed")
            cluster = PostgresCluster(bin_dir).start()
        return cluster.create_database(name)

    try:
        for kind in args.databases.split(","):
            if "ingest" not in args.skip:
                print(f"== ingest into {kind}", flush=True)
                rates = [float(r) for r in args.rates.split(",")]
                results[f"ingest-{kind}"] = ingest_steps(db_url(kind, "ingest"), broker.url, key, root, rates, args)
            if "dashboard" not in args.skip:
                print(f"== dashboard API on {kind}: {args.fleet} devices x {args.minutes} minutes", flush=True)
                url = db_url(kind, "dashboard")
                prepared = populate(url, args.fleet, args.minutes)
                print(f"  prepared {prepared}", flush=True)
                from edgesdk.fleet.service.tokens import create_session, create_token

                engine = open_engine(url)
                token_id, token = create_token(engine, name="bench", role="viewer", created_by="bench")
                session = create_session(engine, token_id)  # the dashboard's cookie is a session id
                engine.dispose()
                proc, port = start_service(url, broker.url, key, root, api=True)
                try:
                    assert port is not None
                    measure_routes(port, token, session, 3, args.fleet)  # warm up
                    results[f"dashboard-{kind}"] = {
                        "prepared": prepared,
                        "routes": measure_routes(port, token, session, args.requests, args.fleet),
                    }
                finally:
                    proc.terminate()
                    proc.wait(30)
    finally:
        broker.stop()
        if cluster is not None:
            cluster.stop()
    results["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
