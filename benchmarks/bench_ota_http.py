"""OTA transfer at fleet scale: HTTP from nginx vs MQTT chunks, side by side in one run (issue 20).

N simulated devices fetch one bundle (random bytes of ``--size-mb``: a bundle is ciphertext, and
the transfer checks only the signed size and hashes) with the REAL transfer code of the agent:
``HttpDownload`` (agent/ota/http_fetch.py: Range requests, every chunk checked, the whole-file
hash at the end) against nginx from Debian, and ``ChunkReceiver`` (agent/ota/transfer.py: the
adaptive request window) against the real ``ChunkServer`` (edgesdk/fleet/chunk_server.py) over
a local mosquitto. What follows the download on a device (verify, smoke test, stage, probation,
commit) is the same code whichever way the bytes came (benchmarks/bench_ota.py measures it), so
"committed" here is: the bundle is on the device's disk and its sha256 matched.

Devices run in ``--procs`` processes, ``--concurrency`` devices at a time in all (a device's
partial file lives in /dev/shm and is removed once verified: the simulator has one disk and
24 GB for what real devices hold on a thousand disks). Reported per transport: seconds until
every device has the bundle, application bytes on the wire per device / bundle size (HTTP:
request + response headers + bodies from nginx's access log; MQTT: payloads + topics + fixed
headers of every message, both directions), server CPU seconds. The MQTT side is run at
``--mqtt-devices`` (default the same N) because on a small machine it is the slow one; its
time at N is then extrapolated from its aggregate throughput (the chunk server is the
bottleneck, so time grows with N × size), and the output says so.

Run: ``.venv/bin/python benchmarks/bench_ota_http.py --devices 1000 --size-mb 20 --mqtt-devices 50``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from edgesdk.offline import disable_vendor_telemetry  # noqa: E402

disable_vendor_telemetry()

from edgesdk.agent.ota.http_fetch import HttpDownload  # noqa: E402
from edgesdk.agent.ota.transfer import ChunkReceiver  # noqa: E402

from edgesdk.protocol import topics  # noqa: E402
from edgesdk.protocol.chunks import chunk_hashes, decode_frame  # noqa: E402
from edgesdk.schemas.messages import ChunkRequest, Deployment  # noqa: E402
from tests.nginx_helpers import Nginx  # noqa: E402

MQTT_FIXED_OVERHEAD = 5  # fixed header + remaining length, QoS 0 (as bench_ota.py counts)
NS = "edgesdk"


def make_bundle(path: Path, size: int) -> Deployment:
    with open(path, "wb") as handle:
        left = size
        while left:
            block = os.urandom(min(left, 1 << 20))
            handle.write(block)
            left -= len(block)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    now = datetime.now(timezone.utc)
    return Deployment(
        deployment_id="bench-http",
        issued_at=now,
        expires_at=now + timedelta(hours=6),
        sequence=1,
        targets=["sim"],
        model_name="bench",
        model_version="1.0.0",
        release=2,
        bundle_sha256=digest,
        bundle_size=size,
        chunk_sha256=chunk_hashes(path, 262144),
    )


def cpu_seconds(pids: list[int], *, children: bool = True) -> float:
    """CPU seconds of ``pids`` (and, with ``children``, of their children: nginx's workers)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for p in [process, *(process.children(recursive=True) if children else [])]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


# -- device processes ------------------------------------------------------------------------------


def _http_devices(args: tuple[list[int], str, str, str, int]) -> list[tuple[int, float, int]]:
    """One simulator process: its devices over HTTP, ``threads`` at a time."""
    indices, deployment_json, url, shm, threads = args
    template = Deployment.model_validate_json(deployment_json)

    def one(index: int) -> tuple[int, float, int]:
        deployment = template.model_copy(update={"artifact_urls": [url]})
        ota_dir = Path(shm) / f"dev-{index:05d}"
        download = HttpDownload(deployment, ota_dir)
        download.run(lambda _f: None, lambda: False)
        done = time.time()
        shutil.rmtree(ota_dir, ignore_errors=True)
        return index, done, download.stats.requests

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, indices))


def _mqtt_devices(args: tuple[list[int], str, str, str, int]) -> list[tuple[int, float, int]]:
    """One simulator process: its devices over MQTT chunks (one client each on a shared network
    loop), ``threads`` at a time; returns (index, finished at, bytes on the wire)."""
    from edgesdk.mqtt.client import ClientOptions, MqttClient, NetworkLoop

    indices, deployment_json, broker_url, shm, threads = args
    deployment = Deployment.model_validate_json(deployment_json)
    loop = NetworkLoop(name="sim-mqtt").start()

    def one(index: int) -> tuple[int, float, int]:
        device_id = f"sim-{index:05d}"
        wire = [0]
        receiver: list[ChunkReceiver] = []
        client = MqttClient(ClientOptions(client_id=device_id, broker_url=broker_url, clean_start=True), loop=loop)
        data_topic = topics.device_topic(NS, device_id, topics.OTA_CHUNK_DATA)
        request_topic = topics.device_topic(NS, device_id, topics.OTA_CHUNK_REQUEST)

        def on_message(topic: str, payload: bytes) -> None:
            wire[0] += len(topic) + 2 + len(payload) + MQTT_FIXED_OVERHEAD
            if receiver:
                header, data = decode_frame(payload)
                receiver[0].on_frame(header, data)

        def request(chunks: list[int]) -> None:
            body = (
                ChunkRequest(
                    device_id=device_id,
                    deployment_id=deployment.deployment_id,
                    bundle_sha256=deployment.bundle_sha256,
                    indices=chunks,
                )
                .model_dump_json()
                .encode()
            )
            wire[0] += len(request_topic) + 2 + len(body) + MQTT_FIXED_OVERHEAD
            client.publish(request_topic, body, qos=1)

        client.on_message = on_message
        client.subscribe(data_topic, qos=0)
        client.start()
        client.wait_connected(60)
        ota_dir = Path(shm) / f"dev-{index:05d}"
        receiver.append(ChunkReceiver(deployment, ota_dir, request))
        receiver[0].run(lambda _f: None, lambda: False)
        done = time.time()
        client.stop(graceful=False)
        shutil.rmtree(ota_dir, ignore_errors=True)
        return index, done, wire[0]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, indices))
    loop.stop()
    return results


def _spread(count: int, procs: int) -> list[list[int]]:
    return [list(range(i, count, procs)) for i in range(procs)]


def run_devices(
    worker: Any, count: int, procs: int, concurrency: int, payload: str, target: str, shm: Path
) -> tuple[float, list[tuple[int, float, int]]]:
    threads = max(1, concurrency // procs)
    jobs = [(part, payload, target, str(shm), threads) for part in _spread(count, procs) if part]
    context = multiprocessing.get_context("fork")
    start = time.time()
    with context.Pool(len(jobs)) as pool:
        results = [r for chunk in pool.map(worker, jobs) for r in chunk]
    return start, results


# -- the two transports ----------------------------------------------------------------------------


def _result(
    transport: str,
    deployment: Deployment,
    start: float,
    results: list[tuple[int, float, int]],
    wire: int,
    server_cpu: float,
    **extra: float,
) -> dict[str, Any]:
    count = len(results)
    return {
        "transport": transport,
        "devices": count,
        "seconds_to_all": round(max(done for _, done, _ in results) - start, 1),
        "wire_bytes_per_device_over_bundle": round(wire / count / deployment.bundle_size, 5),
        "server_cpu_s": round(server_cpu, 1),
        "server_cpu_s_per_gb": round(server_cpu / (count * deployment.bundle_size / 1e9), 3),
        **{k: round(v, 2) for k, v in extra.items()},
    }


def bench_http(
    deployment: Deployment, bundle: Path, count: int, procs: int, concurrency: int, root: Path
) -> dict[str, Any]:
    www = root / "www"
    www.mkdir(parents=True)
    os.link(bundle, www / "bundle.edgepkg")
    nginx = Nginx(root / "nginx", www, workers=2, worker_connections=4096).start()
    shm = Path(tempfile.mkdtemp(prefix="bench-http-", dir="/dev/shm"))
    try:
        assert nginx.process is not None
        cpu0 = cpu_seconds([nginx.process.pid])
        start, results = run_devices(
            _http_devices, count, procs, concurrency, deployment.model_dump_json(), f"{nginx.url}/bundle.edgepkg", shm
        )
        server_cpu = cpu_seconds([nginx.process.pid]) - cpu0
    finally:
        nginx.stop()
        shutil.rmtree(shm, ignore_errors=True)
    entries = [e for e in nginx.entries() if e.uri == "/bundle.edgepkg"]
    wire = sum(e.bytes_sent + e.request_bytes for e in entries)
    return _result(
        "http (nginx)", deployment, start, results, wire, server_cpu, requests_per_device=len(entries) / count
    )


def bench_mqtt(
    deployment: Deployment, bundle: Path, count: int, procs: int, concurrency: int, root: Path
) -> dict[str, Any]:
    from edgesdk.fleet.chunk_server import ChunkServer
    from edgesdk.mqtt.broker import MosquittoBroker
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    shm = Path(tempfile.mkdtemp(prefix="bench-mqtt-", dir="/dev/shm"))
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        client = MqttClient(
            ClientOptions(client_id="bench-chunks", broker_url=broker.url, clean_start=True, max_inflight=1000)
        )
        server = ChunkServer(NS, lambda topic, payload, qos: client.publish(topic, payload, qos=qos))
        client.on_message = server.on_message
        client.subscribe(server.request_filter, qos=0)
        client.start()
        client.wait_connected(10)
        server.add(bundle, deployment)
        try:
            cpu0 = cpu_seconds([broker.pid]) + cpu_seconds([os.getpid()], children=False)  # type: ignore[list-item]
            start, results = run_devices(
                _mqtt_devices, count, procs, concurrency, deployment.model_dump_json(), broker.url, shm
            )
            server_cpu = cpu_seconds([broker.pid]) + cpu_seconds([os.getpid()], children=False) - cpu0  # type: ignore[list-item]
        finally:
            client.stop()
            server.close()
            shutil.rmtree(shm, ignore_errors=True)
    wire = sum(w for _, _, w in results)
    return _result("mqtt chunks (mosquitto + ChunkServer)", deployment, start, results, wire, server_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--mqtt-devices", type=int, default=None, help="N for the MQTT side (default --devices)")
    parser.add_argument("--size-mb", type=float, default=20.0)
    parser.add_argument("--procs", type=int, default=4, help="simulator processes")
    parser.add_argument("--concurrency", type=int, default=64, help="devices downloading at once, all processes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    mqtt_count = args.mqtt_devices or args.devices
    root = Path(tempfile.mkdtemp(prefix="bench-ota-http-"))
    try:
        bundle = root / "bundle.edgepkg"
        deployment = make_bundle(bundle, int(args.size_mb * 1_000_000))
        load = os.getloadavg()
        # MQTT first at its (smaller) N, then HTTP at N: one run, the same machine state.
        mqtt = bench_mqtt(deployment, bundle, mqtt_count, args.procs, min(args.concurrency, mqtt_count), root / "mqtt")
        http = bench_http(deployment, bundle, args.devices, args.procs, args.concurrency, root / "http")
        mqtt_at_n = mqtt["seconds_to_all"] * args.devices / mqtt_count
        result = {
            "bundle_bytes": deployment.bundle_size,
            "procs": args.procs,
            "concurrency": args.concurrency,
            "load_average_at_start": [round(x, 2) for x in load],
            "http": http,
            "mqtt": mqtt,
            "mqtt_seconds_at_http_devices": round(mqtt_at_n, 1),
            "mqtt_extrapolated": mqtt_count != args.devices,
            "time_ratio_mqtt_over_http": round(mqtt_at_n / http["seconds_to_all"], 1),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for side in ("http", "mqtt"):
        r = result[side]
        print(
            f"{r['transport']:40s} {r['devices']:5d} devices  {r['seconds_to_all']:8.1f} s to all  "
            f"wire/bundle {r['wire_bytes_per_device_over_bundle']:.4f}  server CPU {r['server_cpu_s']} s"
        )
    how = "extrapolated linearly from its N" if result["mqtt_extrapolated"] else "measured"
    print(
        f"MQTT at {args.devices} devices: {result['mqtt_seconds_at_http_devices']} s ({how}); "
        f"ratio MQTT/HTTP {result['time_ratio_mqtt_over_http']}x; load {result['load_average_at_start']}"
    )


if __name__ == "__main__":
    main()
