"""Where a MobileNetV2-sized JSON body's decode goes, in process (issue 15, BENCHMARKS.md).

One 1×3×224×224 float32 input written as bench_api.py writes it (``json.dumps`` of
``tolist()``, ~3 MB); best of ``--repeats`` timings, in ms, of the agent's ``decode_json``, its
parts, and what the raw peer does (``np.asarray(orjson.loads(body)[...], dtype=float32)``), the
rows taken in turn (a slow spell of this shared machine hits all of them). The agent reads such a
body with simdjson (agent/api/tensor_json.py) when pysimdjson is installed, else with orjson:
both roads are timed, and their parts.

    .venv/bin/python benchmarks/probe_json_decode.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgesdk.agent.api import tensor_json  # noqa: E402
from edgesdk.agent.api.budget import unlimited_allowance  # noqa: E402
from edgesdk.agent.api.codec import decode_json, json_parse_cost, only_key_strings  # noqa: E402
from edgesdk.agent.tensor_signature import Signature, TensorSlot  # noqa: E402


def best_ms(rows: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time of each row, in ms, the rows taken in turn ``repeats`` times: a slow spell of
    this shared machine then hits every row, not the one that ran through it."""
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(repeats):
        for label, work in rows.items():
            start = time.perf_counter()
            work()
            best[label] = min(best[label], time.perf_counter() - start)
    return {label: seconds * 1e3 for label, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    body = json.dumps({"inputs": {"input": x.tolist()}}).encode()
    signature = Signature([TensorSlot("input", np.dtype("float32"), (1, 3, 224, 224))], [], allow_nonfinite=False)
    values = orjson.loads(body)["inputs"]["input"]
    float64 = np.asarray(values)
    tail = body.index(b"[") - 1
    opens = tensor_json.parse_cost(body, tail)[1]
    rows = {
        "agent: decode_json (whole)": lambda: decode_json(body, signature, unlimited_allowance()),
        "  simdjson road: the memory charge's count (tensor_json.parse_cost)": lambda: tensor_json.parse_cost(
            body, tail
        ),
        "  simdjson road: parse, shape check, float64 copy (_flat_numbers)": lambda: tensor_json._flat_numbers(
            body, "input", opens
        ),
        "agent, orjson road (without pysimdjson; before this session)": lambda: orjson_road(body, signature),
        "  the memory charge's comma count": lambda: json_parse_cost(body),
        "  no strings but the keys (quotes found by memchr)": lambda: only_key_strings(body, 2),
        "  orjson.loads": lambda: orjson.loads(body),
        "  np.asarray(dtype=float32), numbers only": lambda: np.asarray(values, dtype=np.float32),
        "  (before: np.asarray, float64)": lambda: np.asarray(values),
        "  (before: its .astype(float32))": lambda: float64.astype(np.float32),
        "raw peer: loads + asarray(float32) (whole)": lambda: np.asarray(
            orjson.loads(body)["inputs"]["input"], dtype=np.float32
        ),
    }
    print(f"body: {len(body):,} bytes; best of {args.repeats}\n\n| step | ms |\n| --- | ---: |")
    for label, ms in best_ms(rows, args.repeats).items():
        print(f"| {label} | {ms:.2f} |")
    print("\nOther bodies, decode_json in µs (best of --repeats):\n")
    print("| input shape | body bytes | simdjson road | orjson road |\n| --- | ---: | ---: | ---: |")
    for shape in OTHER_SHAPES:
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        other = json.dumps({"inputs": {"input": x.tolist()}}).encode()
        model = Signature([TensorSlot("input", np.dtype("float32"), shape)], [], allow_nonfinite=False)
        times = best_ms(
            {
                "simdjson": lambda other=other, model=model: decode_json(other, model, unlimited_allowance()),
                "orjson": lambda other=other, model=model: orjson_road(other, model),
            },
            args.repeats,
        )
        print(f"| {shape} | {len(other):,} | {times['simdjson'] * 1e3:,.0f} | {times['orjson'] * 1e3:,.0f} |")


#: A digits image (under MIN_BODY_BYTES: both columns take the orjson road), long and short rows.
OTHER_SHAPES = [(1, 1, 8, 8), (1, 1024), (1, 3, 64, 64), (512, 1, 8, 8), (1, 20000, 1)]


def orjson_road(body: bytes, signature: Signature) -> object:
    """decode_json as it reads without pysimdjson."""
    available, tensor_json.AVAILABLE = tensor_json.AVAILABLE, False
    try:
        return decode_json(body, signature, unlimited_allowance())
    finally:
        tensor_json.AVAILABLE = available


if __name__ == "__main__":
    main()
