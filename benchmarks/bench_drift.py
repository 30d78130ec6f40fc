"""Per-request cost of the device's live drift summary (issue 41): counting into the reference
profile's fixed bins (what agent/drift/ does) against Apache DataSketches KLL and t-digest, for
the digits model (1x1x8x8 in, 10 logits out) and a MobileNetV2-sized one (1x3x224x224 in, 1000
out). Every summary reads the same values: about 4,096 per tensor per request (fixed stride).

It prints, it asserts nothing. KLL and t-digest are not dependencies of edgesdk; to compare,
install them beside it (``pip install --target DIR datasketches tdigest``) and name the folder:

    python benchmarks/bench_drift.py [--extra-path DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
from edgesdk.agent.drift.window import ModelWindow, sampled

from edgesdk.drift.profile import build_profile
from edgesdk.drift.schema import ReferenceProfile

SHAPES = {"digits": ((1, 1, 8, 8), 10), "mobilenetv2-sized": ((1, 3, 224, 224), 1000)}


def _best_us(run: Callable[[], None], rounds: int = 5, per_round: int = 200) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            run()
        best = min(best, (time.perf_counter() - started) / per_round)
    return best * 1e6


def _sampled(x: np.ndarray, profile: ReferenceProfile) -> list[np.ndarray]:
    tensor = profile.inputs["x"]
    matrix = sampled(x, tensor.channel_axis, len(tensor.histograms))
    assert matrix is not None
    return [np.ascontiguousarray(row) for row in matrix]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra-path", help="a folder holding datasketches and tdigest (appended to sys.path)")
    args = parser.parse_args()
    if args.extra_path:
        sys.path.append(args.extra_path)  # after the environment's own packages (its numpy wins)
    rng = np.random.default_rng(0)
    for name, (shape, classes) in SHAPES.items():
        images = rng.normal(size=(64, *shape[1:])).astype(np.float32)
        logits = rng.normal(size=(64, classes)).astype(np.float32)
        profile = build_profile({"x": images}, {"y": logits}, classify=True)
        x = rng.normal(size=shape).astype(np.float32)
        y = rng.normal(size=(1, classes)).astype(np.float32)
        window = ModelWindow(profile)
        bins_us = _best_us(lambda: window.add({"x": x}, {"y": y}))  # noqa: B023 - used at once
        input_us = _best_us(lambda: window.add({"x": x}, {}))  # noqa: B023 - used at once
        report_us = _best_us(window.report, per_round=20)
        size = len(profile.model_dump_json())
        print(
            f"{name}: fixed bins {bins_us:.1f} us per request (inputs and outputs), {input_us:.1f} us the input "
            f"only (min/max included), report {report_us:.0f} us"
        )
        print(f"  profile {size} bytes; values read per request: {sum(p.size for p in _sampled(x, profile))}")
        _compare_sketches(x, profile)


def _compare_sketches(x: np.ndarray, profile: ReferenceProfile) -> None:
    try:
        from datasketches import kll_floats_sketch
    except ImportError as exc:
        print(f"  KLL: not measured ({exc}; pass --extra-path)")
    else:
        sketches = [kll_floats_sketch(200) for _ in profile.inputs["x"].histograms]

        def kll() -> None:
            for sketch, part in zip(sketches, _sampled(x, profile), strict=True):
                sketch.update(part)

        print(f"  KLL k=200 (datasketches): {_best_us(kll):.1f} us per request (the input only)")
    try:
        from tdigest import TDigest
    except ImportError as exc:
        print(f"  t-digest: not measured ({exc}; pass --extra-path)")
    else:
        digests = [TDigest() for _ in profile.inputs["x"].histograms]

        def tdigest() -> None:
            for digest, part in zip(digests, _sampled(x, profile), strict=True):
                digest.batch_update(part)

        print(f"  t-digest (tdigest): {_best_us(tdigest, rounds=1, per_round=3):.0f} us per request (the input only)")


if __name__ == "__main__":
    main()
