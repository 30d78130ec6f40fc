"""The dashboard's devices page with 10,000 devices (issue 40: page p95 <= 300 ms).

A SQLite database (and PostgreSQL with ``--postgresql``, a throwaway cluster from
``tests/pg_helpers``) holds ``--devices`` devices in 20 groups and 4 profiles, a tag on every
tenth one and one telemetry report each. The service's real app (``create_app``: the API and the
dashboard) is served by its real HTTP server (``ApiServer``, uvicorn) in this process; one
signed-in session asks ``--requests`` times, one kept-alive connection, for each of:

* ``first page``: ``/ui/devices`` (50 rows, sorted by id);
* ``search``: ``/ui/devices?q=…`` (a part of a device id, a group or a tag: ``%q%`` on each);
* ``sorted page``: ``/ui/devices?sort=seen&desc=1&page=100`` (ORDER BY last_seen, OFFSET 4,950).

p50/p95/max per case, in ms, whole answers (query, HTML, HTTP).

    .venv/bin/python benchmarks/bench_dashboard_devices.py
    .venv/bin/python benchmarks/bench_dashboard_devices.py --postgresql --requests 50
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from edgesdk.fleet.service import schema, tokens  # noqa: E402
from edgesdk.fleet.service.dashboard import COOKIE  # noqa: E402
from edgesdk.fleet.service.database import Transaction, migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.rest.server import ApiServer  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402

CASES = {
    "first page": "/ui/devices",
    "search": "/ui/devices?q=dev-0123",
    "sorted page": "/ui/devices?sort=seen&desc=1&page=100",
}


class NoCommands:
    """The devices page sends no command."""

    def abort(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> None: ...

    def rollback(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> int:
        return 0


def fill(engine: Any, devices: int) -> None:
    now = time.time()
    rows = [
        {
            "device_id": f"dev-{i:05d}",
            "online": i % 7 != 0,
            "profile": ("rpi5-8gb", "rpi4-4gb", "pi-zero-2w", "jetson-orin-nano")[i % 4],
            "groups": json.dumps([f"line-{i % 20}"]),
            "model_name": "digits",
            "model_version": f"1.{i % 3}.0",
            "first_seen": now - 86400,
            "last_seen": now - (i * 7919) % 3600,
        }
        for i in range(devices)
    ]
    telemetry = [{"device_id": r["device_id"], "msg_id": f"m{i}", "seq": 1, "ts": r["last_seen"], "p95_ms": 2.5}
                 for i, r in enumerate(rows)]  # fmt: skip
    tags = [{"device_id": f"dev-{i:05d}", "key": "site", "value": f"lab-{i % 13}", "updated": now}
            for i in range(0, devices, 10)]  # fmt: skip
    with Transaction(engine) as db:
        db.execute(schema.devices.insert(), rows)
        db.execute(schema.telemetry.insert(), telemetry)
        db.execute(schema.device_tags.insert(), tags)


def measure(url: str, engine: Any, requests: int) -> dict[str, list[float]]:
    token_id, _token = tokens.create_token(engine, name="bench", role="viewer", created_by="bench")
    cookie = f"{COOKIE}={tokens.create_session(engine, token_id)}"
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(requests):
        for name, path in CASES.items():
            started = time.perf_counter()
            conn.request("GET", path, headers={"Cookie": cookie})
            answer = conn.getresponse()
            body = answer.read()
            times[name].append((time.perf_counter() - started) * 1000)
            assert answer.status == 200 and b"device-table" in body, (answer.status, body[:300])
    conn.close()
    return times


def run(db_url: str, devices: int, requests: int, data_dir: Path) -> None:
    engine = open_engine(db_url)
    migrate(engine)
    fill(engine, devices)
    store = SqlRolloutStore(engine)
    app = create_app(ApiContext(engine=engine, store=store, commands=NoCommands(), data_dir=data_dir))
    server = ApiServer(app, "127.0.0.1:0").start()
    try:
        times = measure(f"127.0.0.1:{server.port}", engine, requests)
    finally:
        server.stop()
        notifier = getattr(app.state, "webhooks", None)  # the API's webhook thread polls the database
        if notifier is not None:
            notifier.stop()
        engine.dispose()
    for name, values in times.items():
        values.sort()
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        print(f"{db_url.split(':')[0]:<10} {name:<12} p50 {statistics.median(values):7.1f} ms  "
              f"p95 {p95:7.1f} ms  max {values[-1]:7.1f} ms  ({len(values)} requests, {devices} devices)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--postgresql", action="store_true", help="also on a throwaway PostgreSQL cluster")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:///{tmp}/bench.sqlite3", args.devices, args.requests, Path(tmp))
        if args.postgresql:
            from tests.pg_helpers import throwaway_cluster

            with throwaway_cluster() as cluster:
                run(cluster.create_database("bench_devices"), args.devices, args.requests, Path(tmp))


if __name__ == "__main__":
    main()
