"""MobileNetV2's fp32 .tflite by the two routes: litert-torch on the PyTorch module, and the
ONNX export through onnx2torch then litert-torch (converters/onnx2torch_route.py). Size, LiteRT
latency (one thread, rounds interleaved in one process) and the largest output difference
(BENCHMARKS.md, issue 17).

    .venv/bin/python benchmarks/bench_onnx_tflite_route.py [--rounds 60]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def _p50_ms(interpreters: list[Any], image: np.ndarray, rounds: int) -> list[float]:
    def once(it: Any) -> float:
        it.set_tensor(it.get_input_details()[0]["index"], image)
        start = time.perf_counter()
        it.invoke()
        return time.perf_counter() - start

    for it in interpreters:
        for _ in range(5):
            once(it)
    times: list[list[float]] = [[] for _ in interpreters]
    for _ in range(rounds):
        for i, it in enumerate(interpreters):
            times[i].append(once(it))
    return [float(np.median(t)) * 1e3 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import litert_torch
    import torch
    from ai_edge_litert.interpreter import Interpreter
    from edgesdk.converters import onnx2torch_route

    from edgesdk.workloads.mobilenet import pretrained_mobilenet_v2

    if onnx2torch_route.missing_reason():
        raise SystemExit(onnx2torch_route.missing_reason())
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    example = (torch.from_numpy(image),)
    module = pretrained_mobilenet_v2()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "mobilenet_v2.onnx"
        torch.onnx.export(module, example, str(onnx_path), input_names=["image"], opset_version=17, dynamo=False)
        models = {
            "pytorch module": bytes(litert_torch.convert(module, example).model_content()),
            "onnx via onnx2torch": bytes(
                litert_torch.convert(
                    onnx2torch_route.onnx_to_torch(onnx_path, where="mobilenet_v2.onnx"), example
                ).model_content()
            ),
        }
    interpreters = []
    for content in models.values():
        it = Interpreter(model_content=content, num_threads=1)
        it.allocate_tensors()
        interpreters.append(it)
    p50 = _p50_ms(interpreters, image, args.rounds)
    outputs = []
    for it in interpreters:
        it.set_tensor(it.get_input_details()[0]["index"], image)
        it.invoke()
        outputs.append(it.get_tensor(it.get_output_details()[0]["index"]))
    print(f"{'route':<22} {'size MiB':>9} {'p50 ms':>8} {'ratio':>6}")
    for (name, content), ms in zip(models.items(), p50, strict=True):
        print(f"{name:<22} {len(content) / 2**20:>9.2f} {ms:>8.2f} {ms / p50[0]:>6.3f}")
    print(f"max |difference| of the outputs: {np.abs(outputs[0] - outputs[1]).max():.2e}")


if __name__ == "__main__":
    main()
