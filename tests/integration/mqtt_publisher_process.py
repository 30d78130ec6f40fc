"""A minimal device-side publisher process for the SIGKILL tests: the same queue, forwarder
and client code as the agent, without the agent.

    python mqtt_publisher_process.py BROKER_URL DB_PATH --start N --count M [--wait-empty] [--window W]
                                     [--publish-delay-ms D]

Enqueues messages ``N .. N+M-1`` (JSON with index and msg_id) on ``edgesdk/devices/proc/telemetry``,
prints ``queued`` and keeps forwarding until killed, or until the queue is empty with
``--wait-empty`` (then prints ``empty`` and exits 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from edgesdk.mqtt.client import ClientOptions, MqttClient
from edgesdk.mqtt.forwarder import QueueForwarder
from edgesdk.mqtt.queue import MessageQueue

TOPIC = "edgesdk/devices/proc/telemetry"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("broker")
    parser.add_argument("db", type=Path)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--wait-empty", action="store_true")
    parser.add_argument("--window", type=int, default=64, help="QoS 1 messages in flight (1 = slow, steady drain)")
    parser.add_argument(
        "--publish-delay-ms",
        type=float,
        default=0.0,
        help="sleep before each publish, so a drain lasts long enough to be killed in its middle on a busy machine",
    )
    args = parser.parse_args()
    queue = MessageQueue(args.db)
    client = MqttClient(ClientOptions(client_id="proc", broker_url=args.broker, backoff_min_s=0.1, backoff_max_s=1.0))
    if args.publish_delay_ms > 0:
        publish = client.publish

        def slow_publish(*pargs, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(args.publish_delay_ms / 1000)
            return publish(*pargs, **kwargs)

        client.publish = slow_publish  # type: ignore[method-assign]
    forwarder = QueueForwarder(queue, client, window=args.window)
    client.start()
    for index in range(args.start, args.start + args.count):
        queue.enqueue(TOPIC, json.dumps({"index": index, "msg_id": uuid.uuid4().hex}).encode())
        forwarder.pump()
    print("queued", queue.depth, flush=True)
    while True:
        if args.wait_empty and queue.depth == 0 and forwarder.inflight == 0:
            client.stop()
            queue.close()
            print("empty", flush=True)
            return 0
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
