"""Folded vs unfolded pre-processing per runtime, in-process (issue 42): MobileNetV2 (ImageNet
weights, fp32, batch 1) as ONNX (onnxruntime), OpenVINO IR and .tflite (LiteRT), each twice:
as converted, and with ``folded: [normalize, cast]`` folded into its graph
(converters/graph_fold.py, fold_openvino.py, fold_tflite.py).

Timed in two phases, each with its cells taking turns call by call in a rotating order (so a
shared machine's load hits each alike): ``edgesdk.pipeline.preprocess`` of a JPEG (decode,
resize 256, centre crop 224, then mean/std in numpy and a float32 tensor, or for the folded
graph the decoder's uint8 as is), which is the same for every runtime; then each model's run
on those tensors through the agent's own loader (``edgesdk.runtimes.load_variant``, one
thread: the converters' host timing settings). Timed together, the decode's time depended
on which runtime ran just before it (~3.5 ms right after OpenVINO's run, ~27 ms after the
others' on a loaded machine; the cause was not found), so the two phases are timed apart.
Printed: p50 (and mean) per phase, and pre + run per runtime, folded / unfolded.

Run: ``.venv/bin/python benchmarks/bench_fold.py [--requests 100] [--json]``. Needs torch, the
MobileNetV2 weights, scikit-image/scikit-learn photos, Pillow, onnxruntime, OpenVINO, LiteRT
and litert-torch (a runtime that is missing is left out and named).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

PIPELINE = {
    "input": "image",
    "image": {
        "color": "RGB",
        "resize": {"height": 256, "width": 256, "interpolation": "bilinear"},
        "center_crop": {"height": 224, "width": 224},
        "scale": 1 / 255,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "layout": "NCHW",
    },
}


def _artifacts(work: Path) -> dict[str, tuple[str, dict[str, Path]]]:
    """runtime → (its name for load_variant, {file name: path}) of the unfolded model."""
    import torch

    from edgesdk.workloads.mobilenet import pretrained_mobilenet_v2

    module = pretrained_mobilenet_v2()
    example = torch.zeros(1, 3, 224, 224)
    onnx_path = work / "model.onnx"
    torch.onnx.export(module, example, str(onnx_path), input_names=["image"], output_names=["logits"], dynamo=False)
    made = {"onnxruntime": ("onnxruntime", {"model.onnx": onnx_path})}
    try:
        import openvino as ov

        ov.save_model(ov.convert_model(str(onnx_path)), str(work / "model.xml"), compress_to_fp16=False)
        made["openvino"] = ("openvino", {"model.xml": work / "model.xml", "model.bin": work / "model.bin"})
    except ImportError as exc:
        print(f"openvino left out: {exc}", file=sys.stderr)
    try:
        import litert_torch

        (work / "model.tflite").write_bytes(bytes(litert_torch.convert(module, (example,)).model_content()))
        made["litert"] = ("litert", {"model.tflite": work / "model.tflite"})
    except ImportError as exc:
        print(f"litert left out: {exc}", file=sys.stderr)
    return made


def _folded_copy(files: dict[str, Path], fmt: str, pre: Any, into: Path) -> dict[str, Path]:
    from edgesdk.converters.graph_fold import fold_artifact

    into.mkdir()
    copied = {}
    for name, path in files.items():
        copied[name] = into / name
        copied[name].write_bytes(path.read_bytes())
    fold_artifact(copied, pre, fmt, cast=True)
    return copied


def _jpegs() -> list[bytes]:
    from PIL import Image

    from edgesdk.workloads.mobilenet import sample_images

    out = []
    for _, pixels in sample_images():  # one size (a VGA camera frame): the decode costs alike
        body = io.BytesIO()
        Image.fromarray(pixels).resize((640, 480), Image.Resampling.BILINEAR).save(body, format="JPEG", quality=90)
        out.append(body.getvalue())
    return out


def _timed(cells: dict[str, Any], requests: int, step: Any) -> dict[str, list[float]]:
    """ms per call of ``step(cell, i)`` per cell, cells taking turns in a rotating order (5 warm-up rounds)."""
    names, times = list(cells), {name: [] for name in cells}
    for i in range(requests + 5):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            start = time.perf_counter()
            step(cells[name], i)
            if i >= 5:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def _row(ms: list[float]) -> str:
    return f"{np.median(ms):.2f} / {np.mean(ms):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="per cell")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    from edgesdk.converters.validate import host_options

    from edgesdk.pipeline import preprocess
    from edgesdk.runtimes import load_variant
    from edgesdk.schemas.pipeline import Pipeline

    plain = Pipeline.model_validate(PIPELINE)
    folded = plain.model_copy(update={"folded": ["normalize", "cast"]})
    formats = {"onnxruntime": "onnx", "openvino": "openvino", "litert": "tflite"}
    jpegs = _jpegs()
    # 1. The pre-processing alone (the same for every runtime): numpy mean/std + float32, or uint8 as decoded.
    pres = {"unfolded": (plain, "float32"), "folded": (folded, "uint8")}
    pre_ms = _timed(
        pres,
        args.requests,
        lambda c, i: preprocess(c[0], jpegs[i % len(jpegs)], "image/jpeg", [SimpleNamespace(name="image", dtype=c[1])]),
    )
    # 2. The model's run per runtime on those tensors: the folded graph does the steps itself.
    cells: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fold-") as scratch:
        work = Path(scratch)
        for runtime, (name, files) in _artifacts(work).items():
            fold = _folded_copy(files, formats[runtime], plain.image, work / f"{runtime}-folded")
            for label, chosen in (("unfolded", files), ("folded", fold)):
                options = host_options(name, {"INFERENCE_PRECISION_HINT": "f32"} if name == "openvino" else None)
                model = load_variant(name, {n: p.read_bytes() for n, p in chosen.items()}, options=options)
                pipeline, dtype = pres[label]
                spec = SimpleNamespace(name=model.inputs[0].name, dtype=dtype)
                feeds = [preprocess(pipeline, jpeg, "image/jpeg", [spec]) for jpeg in jpegs]
                cells[f"{runtime} {label}"] = (model, feeds)
        run_ms = _timed(cells, args.requests, lambda c, i: c[0].run(c[1][i % len(c[1])]))
        for model, _ in cells.values():
            model.close()
    result = {"pre": {k: float(np.median(v)) for k, v in pre_ms.items()}}
    result["run"] = {k: float(np.median(v)) for k, v in run_ms.items()}
    if args.json:
        print(json.dumps(result, indent=2))
    print(f"pre-processing p50 / mean ms: unfolded {_row(pre_ms['unfolded'])}, folded {_row(pre_ms['folded'])}")
    print(
        f"{'runtime':<12} {'run unfolded':>14} {'run folded':>14} {'pre+run unfolded':>17} {'pre+run folded':>15} {'ratio':>6}"
    )
    for runtime in formats:
        if f"{runtime} folded" not in run_ms:
            continue
        u, f = run_ms[f"{runtime} unfolded"], run_ms[f"{runtime} folded"]
        total_u = np.median(pre_ms["unfolded"]) + np.median(u)
        total_f = np.median(pre_ms["folded"]) + np.median(f)
        print(
            f"{runtime:<12} {np.median(u):>14.2f} {np.median(f):>14.2f} {total_u:>17.2f} {total_f:>15.2f} {total_f / total_u:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
