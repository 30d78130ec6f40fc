"""Call a running edge-agent's local API from Python: status, model, inference (JSON and .npy).

    python examples/device/client.py http://127.0.0.1:8470 [--images N]

Only the standard library and numpy (which every device install has). The digits model takes
``image``: float32[batch, 1, 8, 8] and answers ``logits``: float32[batch, 10].
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import urllib.request

import numpy as np


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def infer_json(base: str, model: str, images: np.ndarray) -> dict:
    """POST the batch as JSON; the answer names the model version and variant that served it."""
    body = json.dumps({"inputs": {"image": images.tolist()}}).encode()
    request = urllib.request.Request(
        f"{base}/v1/models/{model}/infer", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def infer_npy(base: str, model: str, images: np.ndarray) -> tuple[np.ndarray, str]:
    """POST one .npy array and get the output back as .npy: no JSON number parsing on either side."""
    buffer = io.BytesIO()
    np.save(buffer, images, allow_pickle=False)
    request = urllib.request.Request(
        f"{base}/v1/models/{model}/infer",
        data=buffer.getvalue(),
        headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        variant = response.headers.get("X-Model-Variant", "?")
        return np.load(io.BytesIO(response.read()), allow_pickle=False), variant


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the agent's base URL, e.g. http://127.0.0.1:8470")
    parser.add_argument("--images", type=int, default=32, help="how many test digits to classify")
    args = parser.parse_args()
    base = args.url.rstrip("/")

    status = get_json(f"{base}/v1/status")
    model = status["model"]
    if model is None:
        print("the agent serves no model yet: install a bundle first (edge-agent install)", file=sys.stderr)
        return 1
    print(
        f"device {status['device_id']} ({status['profile']}): {model['model']} {model['version']}, "
        f"variant {model['variant']} ({model['precision']}), governor {status['governor']['state']}"
    )
    variants = get_json(f"{base}/v1/models")["models"][0]["variants"]
    print("variants on the ladder:", ", ".join(f"{v['id']} ({v['precision']})" for v in variants))

    from sklearn.datasets import load_digits  # the same 8x8 digits the model was trained on

    digits = load_digits()
    images = (digits.images[-args.images :] / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target[-args.images :]

    began = time.perf_counter()
    answer = infer_json(base, model["model"], images)
    json_ms = (time.perf_counter() - began) * 1000
    predicted = np.asarray(answer["outputs"]["logits"]).argmax(axis=1)
    print(
        f"JSON: {len(images)} images in {json_ms:.1f} ms, accuracy {(predicted == labels).mean():.1%}, "
        f"served by {answer['version']} / {answer['variant']}"
    )

    began = time.perf_counter()
    logits, variant = infer_npy(base, model["model"], images)
    npy_ms = (time.perf_counter() - began) * 1000
    print(
        f".npy: {len(images)} images in {npy_ms:.1f} ms, accuracy {(logits.argmax(axis=1) == labels).mean():.1%}, "
        f"variant {variant}"
    )
    return 0 if (predicted == labels).mean() >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
