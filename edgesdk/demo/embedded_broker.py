"""An embedded pure-Python MQTT 3.1.1 broker (amqtt) for machines without mosquitto.

Run as its own process by the demo: ``python -m edgesdk.demo.embedded_broker --port N``.
Loopback only, anonymous (like the demo's mosquitto). It is a convenience for trying edgesdk;
fleets and the test suite use mosquitto.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal


def amqtt_available() -> bool:
    try:
        import amqtt.broker  # noqa: F401
    except ImportError:
        return False
    return True


async def serve(port: int) -> None:
    from amqtt.broker import Broker

    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="embedded MQTT broker for the edgesdk demo")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
