"""Converters: size ratios, accuracy of every shipped variant, int8/fp32 latency, conversion time.

Runs ``edgesdk.converters.convert`` on the digits CNN and on MobileNetV2 (both as PyTorch) for a
Raspberry Pi 5 profile (TFLite, ONNX, OpenVINO; validated numerically here) and an Apple profile
(Core ML, spec-only on Linux), side by side, and prints one table per model plus the ratios the
issue sets goals for (int8/fp32 size ≤ 0.30, fp16/fp32 ≤ 0.55, int8 never slower than fp32).

    .venv/bin/python benchmarks/bench_convert.py [--models digits,mobilenet] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def digits_case(work: Path) -> dict:
    from edgesdk.workloads.digits import prepare_digits

    artifacts = prepare_digits(ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1")
    return {
        "name": "digits",
        "model": artifacts.load_model(),
        "calibration": artifacts.calibration,
        "validation": artifacts.validation,
        "gate": 0.99,
    }


def mobilenet_case(work: Path) -> dict:
    from edgesdk.workloads.mobilenet import prepare_mobilenet, pretrained_mobilenet_v2

    data = prepare_mobilenet(ROOT / ".pytest_cache" / "d" / "edgesdk-mobilenet-v1")
    return {
        "name": "mobilenet_v2",
        "model": pretrained_mobilenet_v2(),
        "calibration": data.calibration,
        "validation": data.validation,
        "gate": 0.95,
    }


def run(case: dict, profile: str, work: Path) -> tuple[dict, float]:
    from edgesdk.converters import convert

    out = work / f"{case['name']}-{profile}"
    started = time.perf_counter()
    report = convert(
        case["model"], profile, out, calibration=case["calibration"], validation=case["validation"],
        gate=case["gate"], name=case["name"], output_names=["logits"],
    )  # fmt: skip
    return report.model_dump(mode="json"), time.perf_counter() - started


def summarize(report: dict, wall_s: float) -> list[dict]:
    rows = []
    by_format: dict[str, dict[str, dict]] = {}
    for v in report["variants"]:
        by_format.setdefault(v["format"], {})[v["precision"]] = v
    for variants in by_format.values():
        fp32 = variants.get("fp32")
        for v in variants.values():
            m = v["measurements"]
            row = {
                "model": report["model_name"], "profile": report["profile"], "variant": v["id"],
                "method": v["quantization_method"] or "", "kib": round(v["size"] / 1024, 1),
                "size_vs_fp32": round(v["size"] / fp32["size"], 3) if fp32 else None,
                "agreement": round(v["accuracy"]["value"], 4) if v["accuracy"] else None,
                "p50_ms": m["latency_p50_ms"],
                "latency_vs_fp32": round(m["latency_p50_ms"] / fp32["measurements"]["latency_p50_ms"], 2)
                if fp32 and m["latency_p50_ms"] and fp32["measurements"]["latency_p50_ms"] else None,
                "convert_s": m["convert_s"], "validation": v["validation"],
            }  # fmt: skip
            rows.append(row)
    for r in report["rejected"]:
        rows.append({"model": report["model_name"], "profile": report["profile"], "variant": f"{r['format']}-{r['precision']}",
                     "rejected": r["reason"]})  # fmt: skip
    rows.append(
        {
            "model": report["model_name"],
            "profile": report["profile"],
            "variant": "(whole conversion)",
            "wall_s": round(wall_s, 1),
        }
    )
    return rows


def print_rows(rows: list[dict]) -> None:
    print("| model | profile | variant | method | KiB | size/fp32 | top-1 agreement | p50 ms | p50/fp32 | convert s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "rejected" in r:
            print(f"| {r['model']} | {r['profile']} | {r['variant']} | rejected: {r['rejected']} | | | | | | |")
        elif "wall_s" in r:
            print(f"| {r['model']} | {r['profile']} | {r['variant']} | | | | | | | {r['wall_s']} |")
        else:
            agreement = "spec-only" if r["agreement"] is None else f"{r['agreement']:.2%}"
            cells = [r["model"], r["profile"], r["variant"], r["method"], r["kib"], r["size_vs_fp32"], agreement,
                     r["p50_ms"] or "–", r["latency_vs_fp32"] or "–", r["convert_s"]]  # fmt: skip
            print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,mobilenet")
    parser.add_argument("--profiles", default="rpi5-8gb,apple-m2-mac")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cases = {"digits": digits_case, "mobilenet": mobilenet_case}
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    rows: list[dict] = []
    try:
        for name in args.models.split(","):
            case = cases[name](work)
            for profile in args.profiles.split(","):
                report, wall = run(case, profile, work)
                rows += summarize(report, wall)
                print(f"# {name} → {profile}: {wall:.1f} s", file=sys.stderr)
                for decision in report["decisions"]:
                    if (
                        "measured" in decision
                        or "latency" in decision
                        or "repaired" in decision
                        or "dropped" in decision
                    ):
                        print(f"#   {decision}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
