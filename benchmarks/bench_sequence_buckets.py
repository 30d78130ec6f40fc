"""TFLite sequence buckets on MiniLM-L6: what a short sentence costs through its bucket vs the
longest signature, and what the buckets cost in size (BENCHMARKS.md, issue 17).

    .venv/bin/python benchmarks/bench_sequence_buckets.py [--out DIR] [--rounds 40] [--json OUT.json]

Converts all-MiniLM-L6-v2 (edgesdk.workloads.text_encoder, sequence 32, calibration/validation
sentences from different stdlib modules) to TFLite fp32 and dynamic int8 twice — with a
``sequence`` axis (buckets) and without (one static length) — unless ``--out`` already holds
both. Then, per variant, one LiteRT interpreter (1 thread) times each bucket length with a
request of exactly that length, and the static model with the same request padded to 32; rounds
interleaved, medians reported with their ratio. Sizes and the gate's cosine come from the
reports.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def convert_both(out: Path) -> None:
    from edgesdk.converters import convert

    from edgesdk.workloads.text_encoder import INPUT_NAMES, minilm_encoder, prepare_text

    data = prepare_text(out / "data", calibration=64, validation=320)
    for name, axes in (("buckets", {n: {1: "sequence"} for n in INPUT_NAMES}), ("static", None)):
        if (out / name / "report.json").exists():
            continue
        print(f"converting MiniLM-L6 to TFLite ({name}) ...", flush=True)
        convert(
            minilm_encoder(), "rpi5-8gb", out / name, calibration=data.calibration, validation=data.validation,
            formats=["tflite"], precisions=["fp32", "int8"], int8_methods=["dynamic-int8"],
            output_names=["embedding"], name="minilm", dynamic_axes=axes,
        )  # fmt: skip


def load(folder: Path, variant: dict[str, Any]) -> Any:
    from edgesdk.runtimes import load_variant

    files = {f.rsplit("/", 1)[-1]: (folder / f).read_bytes() for f in variant["files"]}
    return load_variant("litert", files, options={"num_threads": "1"})


def request(length: int) -> dict[str, np.ndarray]:
    ids = (np.arange(length, dtype=np.int32) * 37) % 30000 + 1000
    return {
        "input_ids": ids[None],
        "attention_mask": np.ones((1, length), np.int32),
        "token_type_ids": np.zeros((1, length), np.int32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "edgesdk" / "bench-sequence-buckets")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    convert_both(args.out)
    reports = {n: json.loads((args.out / n / "report.json").read_text()) for n in ("buckets", "static")}
    results = []
    for precision in ("fp32", "int8"):
        bucketed_v = next(v for v in reports["buckets"]["variants"] if v["precision"] == precision)
        static_v = next(v for v in reports["static"]["variants"] if v["precision"] == precision)
        bucketed, static = load(args.out / "buckets", bucketed_v), load(args.out / "static", static_v)
        longest = bucketed.bucket_lengths[-1]
        cells = {length: request(length) for length in bucketed.bucket_lengths}
        padded = {
            length: {k: np.pad(v, ((0, 0), (0, longest - length))) for k, v in r.items()} for length, r in cells.items()
        }
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(3):  # warm-up: first calls allocate
            for length in cells:
                bucketed.run(cells[length])
                static.run(padded[length])
        for _ in range(args.rounds):
            for length in cells:
                for label, model, feeds in (("bucket", bucketed, cells[length]), ("static", static, padded[length])):
                    started = time.perf_counter()
                    model.run(feeds)
                    times.setdefault((label, length), []).append((time.perf_counter() - started) * 1e3)
        for length in cells:
            b, s = (float(np.median(times[(label, length)])) for label in ("bucket", "static"))
            results.append({"precision": precision, "length": length, "bucket_ms": b, "static_ms": s, "ratio": b / s})
        results.append({
            "precision": precision, "size_buckets": bucketed_v["size"], "size_static": static_v["size"],
            "cosine_buckets": bucketed_v["accuracy"]["value"], "cosine_static": static_v["accuracy"]["value"],
            "lower_bound_buckets": bucketed_v["accuracy"]["lower_bound"],
        })  # fmt: skip
        bucketed.close()
        static.close()
    print(f"load average {os.getloadavg()[0]:.2f}; LiteRT, 1 thread, batch 1, {args.rounds} interleaved rounds")
    print(f"{'precision':9} {'length':>6} {'bucket ms':>10} {'static(32) ms':>13} {'ratio':>6}")
    for r in results:
        if "length" in r:
            print(
                f"{r['precision']:9} {r['length']:>6} {r['bucket_ms']:>10.2f} {r['static_ms']:>13.2f} {r['ratio']:>6.2f}"
            )
        else:
            print(
                f"{r['precision']}: size with buckets {r['size_buckets'] / 1e6:.2f} MB vs static {r['size_static'] / 1e6:.2f} MB "
                f"({r['size_buckets'] / r['size_static']:.3f}x); cosine {r['cosine_buckets']:.5f} (lower bound "
                f"{r['lower_bound_buckets']}) vs {r['cosine_static']:.5f}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
