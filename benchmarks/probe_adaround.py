"""AdaRound (aimet-onnx) on MobileNetV2 against nearest rounding, both exported as QDQ and run
in onnxruntime: top-1 agreement with fp32 on the 328 disjoint validation views, latency one
thread (BENCHMARKS.md, issue 17, fifth pass). A probe, not a recipe.

aimet-onnx cannot share the project's venv (its onnx2torch pulls a torchvision that does not
import beside the CPU torch; docs/converters.md), so it runs from a side venv that sees the
project's packages, with a stand-in torchvision:

    python3 -m venv /tmp/aimet-venv
    echo "import site; site.addsitedir('$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')')" \\
        > "$(/tmp/aimet-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/project.pth"
    /tmp/aimet-venv/bin/pip install --no-deps aimet-onnx==2.42.0
    /tmp/aimet-venv/bin/pip install bokeh hvplot osqp pandas pybind11
    EDGESDK_WHEELS=.venv/wheels SCHEME=tf_enhanced \
        /tmp/aimet-venv/bin/python benchmarks/probe_adaround.py --iterations 1000 --views 64

It exports the fp32 ONNX itself (opset 17, batch 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np


def _stand_in_torchvision() -> None:
    ops = types.ModuleType("torchvision.ops")
    package = types.ModuleType("torchvision")
    package.ops = ops  # type: ignore[attr-defined]

    def missing(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError("torchvision stand-in")

    ops.nms = ops.roi_align = ops.box_convert = missing  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = package, ops


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _top1(path: Path, images: np.ndarray) -> np.ndarray:
    session = _session(path, 2)
    return np.array([int(session.run(None, {"image": images[i : i + 1]})[0].argmax()) for i in range(len(images))])


def _p50_ms(path: Path, image: np.ndarray, rounds: int = 30) -> float:
    session = _session(path, 1)
    for _ in range(5):
        session.run(None, {"image": image})
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        session.run(None, {"image": image})
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=1000, help="AdaRound steps per layer (aimet recommends 10,000)"
    )
    parser.add_argument("--views", type=int, default=64, help="calibration views AdaRound optimises on")
    args = parser.parse_args()
    _stand_in_torchvision()
    import onnx
    import torch
    from aimet_onnx.adaround.adaround_weight import Adaround
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.common import quantsim_config
    from aimet_onnx.quantsim import QuantizationSimModel

    from edgesdk.workloads.mobilenet import prepare_mobilenet, pretrained_mobilenet_v2

    work = Path(tempfile.mkdtemp(prefix="edgesdk-adaround-"))
    data = prepare_mobilenet(work / "data")
    calibration = np.load(data.calibration)["image"]
    validation = np.load(data.validation)["image"]
    fp32 = work / "fp32.onnx"
    torch.onnx.export(
        pretrained_mobilenet_v2(), (torch.from_numpy(validation[:1]),), str(fp32), input_names=["image"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    reference = _top1(fp32, validation)
    config = str(Path(quantsim_config.__file__).parent / "default_config_per_channel.json")
    samples = [{"image": calibration[i : i + 1]} for i in range(len(calibration))]

    def sim() -> Any:
        model = onnx.load(str(fp32))
        fold_all_batch_norms_to_weight(model)
        return QuantizationSimModel(
            model, param_type="int8", activation_type="int8",
            quant_scheme=os.environ.get("SCHEME", "tf_enhanced"), config_file=config,
        )  # fmt: skip

    results: dict[str, Any] = {"fp32_p50_ms": _p50_ms(fp32, validation[:1])}
    for name in ("nearest", "adaround"):
        start = time.time()
        quantsim = sim()
        if name == "adaround":
            Adaround.apply_adaround(quantsim, samples[: args.views], num_iterations=args.iterations)
        quantsim.compute_encodings(samples)
        path = work / f"{name}.onnx"
        onnx.save(quantsim.to_onnx_qdq(), str(path))
        agreement = float((_top1(path, validation) == reference).mean())
        p50 = _p50_ms(path, validation[:1])
        results[name] = {
            "agreement": agreement, "views": len(validation), "p50_ratio": p50 / results["fp32_p50_ms"],
            "build_s": time.time() - start,
        }  # fmt: skip
        print(name, json.dumps(results[name]), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
