"""The fleet service with a kill switch, for the restart tests: the same FleetService that
``edgesdk fleet serve`` runs, given an ``on_progress`` hook that SIGKILLs this process at the
rollout step named by ``--kill-at`` (the seam is a constructor parameter, not a setting the
service reads).

Steps: ``wave_started:N`` (state stored, command not sent), ``wave_sent:N`` (sent and
recorded), ``probation:N`` (a device of wave N reported PROBATION), ``wave_done:N`` (wave N
passed, next wave not stored yet), ``abort_decided:N`` (abort and its rollback stored, not
sent), ``aborted:N`` (rollback sent)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any


def killer(spec: str | None) -> Any:
    if spec is None:
        return None
    name, wave = spec.split(":")

    def on_progress(event: str, info: dict[str, Any]) -> None:
        if info.get("wave") != int(wave):
            return
        hit = event == name or (
            name == "probation" and event == "wave_progress" and "PROBATION" in info.get("states", {})
        )
        if hit:
            print(f"KILLED AT {spec}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return on_progress


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--operator-key", required=True)
    parser.add_argument("--kill-at", default=None)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--api", default=None, help="HOST:PORT of the REST API (port 0: any)")
    parser.add_argument("--data-dir", default=".")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)

    from edgesdk.fleet.service.service import FleetService, ServiceSettings, service_client_id
    from edgesdk.keys import load_publisher_private_key
    from edgesdk.mqtt.client import ClientOptions

    options = ClientOptions(client_id=service_client_id("edgesdk"), broker_url=args.broker, backoff_max_s=1.0)
    from pathlib import Path

    settings = ServiceSettings(
        db_url=args.db,
        poll_s=args.poll,
        maintenance_interval_s=5.0,
        api_bind=args.api,
        data_dir=Path(args.data_dir),
        registry_path=Path(args.data_dir) / "enrollment.json",
    )
    service = FleetService(
        settings, options, load_publisher_private_key(args.operator_key), on_progress=killer(args.kill_at)
    ).start()
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    if service.api is not None:
        (Path(args.data_dir) / "api.port").write_text(str(service.api.port))
    print("SERVICE READY", file=sys.stderr, flush=True)
    service.serve_forever()


if __name__ == "__main__":
    main()
