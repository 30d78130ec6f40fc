"""Call a running edge-agent's local API from Python with edgesdk.AgentClient (and its async twin).

    python examples/device/client.py http://127.0.0.1:8470 [--images N]
    python examples/device/client.py --unix-socket /run/edgesdk/agent.sock

The client needs only edgesdk's core and numpy (no HTTP package), which every device install
has. The digits model takes ``image``: float32[batch, 1, 8, 8] and answers ``logits``:
float32[batch, 10]; arrays travel in the agent's raw tensor encoding (no JSON numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import numpy as np

from edgesdk import AgentClient, AsyncAgentClient
from edgesdk.errors import AgentInputError


async def classify_concurrently(client: AsyncAgentClient, model: str, batches: list[np.ndarray]) -> np.ndarray:
    """Several requests in flight at once: the agent runs them in its worker pool."""
    async with client:
        answers = await asyncio.gather(*(client.infer(model, batch) for batch in batches))
    return np.concatenate([answer["logits"] for answer in answers])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="the agent's base URL, e.g. http://127.0.0.1:8470")
    parser.add_argument("--unix-socket", help="the agent's api.unix_socket instead of a URL")
    parser.add_argument("--images", type=int, default=32, help="how many test digits to classify")
    args = parser.parse_args()
    address = {"unix_socket": args.unix_socket} if args.unix_socket else {"url": args.url}

    with AgentClient(**address, timeout=10) as agent:
        agent.wait_ready(timeout=30)
        status = agent.status()
        model = status["model"]
        print(
            f"device {status['device_id']} ({status['profile']}): {model['model']} {model['version']}, "
            f"variant {model['variant']} ({model['precision']}), governor {status['governor']['state']}"
        )
        variants = agent.models()[0]["variants"]
        print("variants on the ladder:", ", ".join(f"{v['id']} ({v['precision']})" for v in variants))

        from sklearn.datasets import load_digits  # the same 8x8 digits the model was trained on

        digits = load_digits()
        images = (digits.images[-args.images :] / 16.0).astype(np.float32)[:, None, :, :]
        labels = digits.target[-args.images :]

        began = time.perf_counter()
        outputs = agent.infer(model["model"], images)  # one array: the model's only input
        took_ms = (time.perf_counter() - began) * 1000
        accuracy = float((outputs["logits"].argmax(axis=1) == labels).mean())
        print(
            f"infer: {len(images)} images in {took_ms:.1f} ms, accuracy {accuracy:.1%}, "
            f"served by {model['version']} / {outputs.variant}"
        )

        try:
            agent.infer(model["model"], {"image": images.astype(np.float64)})
        except AgentInputError as exc:  # 422: the agent names what does not match
            print(f"refused as expected ({exc.status}): {exc.detail}")

    batches = np.array_split(images, 4)
    began = time.perf_counter()
    logits = asyncio.run(classify_concurrently(AsyncAgentClient(**address, timeout=10), model["model"], batches))
    took_ms = (time.perf_counter() - began) * 1000
    async_accuracy = float((logits.argmax(axis=1) == labels).mean())
    print(f"async: {len(batches)} concurrent requests in {took_ms:.1f} ms, accuracy {async_accuracy:.1%}")
    return 0 if min(accuracy, async_accuracy) >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
