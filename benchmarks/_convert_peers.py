"""What Olive and Optimum make of the same fp32 ONNX, for benchmarks/bench_convert.py.

Run as a script in the Python that has the tool (Optimum pins transformers < 4.58, so it
lives in a venv of its own; Olive installs beside edgesdk):

    python _convert_peers.py RECIPE MODEL.onnx CALIBRATION.npz OUT_DIR [CONFIG_DIR]

and prints the quantized model's path on its last line. Recipes, each the tool's documented
CPU recipe for that kind of model, with its defaults:

``olive-static``
    Olive ``OnnxStaticQuantization`` (QDQ, min-max calibration on our calibration ``.npz``).
``olive-bert-dynamic``
    Olive ``OrtTransformersOptimization`` (``model_type=bert``: fused attention, LayerNorm,
    GELU) then ``OnnxDynamicQuantization``: Olive's BERT-on-CPU example.
``optimum-dynamic``
    Optimum ``ORTQuantizer`` with ``AutoQuantizationConfig.arm64(is_static=False,
    per_channel=True)`` (the config for an aarch64 target such as rpi5-8gb); it needs the
    model's Hugging Face ``config.json`` (CONFIG_DIR).

Olive's telemetry is off (``OLIVE_DISABLE_TELEMETRY=1``, set here before import).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

os.environ["OLIVE_DISABLE_TELEMETRY"] = "1"

#: Olive reads calibration through a registered dataset: this one yields our ``.npz`` samples.
OLIVE_DATASET = """
import numpy as np
from olive.data.registry import Registry


class NpzSamples:
    def __init__(self, path):
        self.data = dict(np.load(path))
        self.count = len(next(iter(self.data.values())))

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        # One sample without its batch axis: Olive's dataloader (batch_size 1) adds it back.
        return {name: value[index] for name, value in self.data.items()}, 0


@Registry.register_dataset()
def edgesdk_npz(data_dir=None, path=None, **kwargs):
    return NpzSamples(path)
"""

OLIVE_PASSES: dict[str, dict[str, dict[str, object]]] = {
    "olive-static": {"quant": {"type": "OnnxStaticQuantization", "data_config": "calibration"}},
    "olive-bert-dynamic": {
        # MiniLM-L6: 12 heads, 384 wide (the fusion needs them for a model without metadata).
        "fuse": {"type": "OrtTransformersOptimization", "model_type": "bert", "num_heads": 12, "hidden_size": 384},
        "quant": {"type": "OnnxDynamicQuantization"},
    },
}


def olive(recipe: str, model: Path, calibration: Path, out: Path) -> Path:
    from olive.workflows import run

    script = out / "edgesdk_olive_data.py"
    script.write_text(OLIVE_DATASET)
    config = {
        "input_model": {"type": "ONNXModel", "model_path": str(model)},
        "data_configs": [
            {
                "name": "calibration",
                "user_script": str(script),
                "load_dataset_config": {"type": "edgesdk_npz", "params": {"path": str(calibration)}},
                "dataloader_config": {"batch_size": 1},
            }
        ],
        "passes": OLIVE_PASSES[recipe],
        "output_dir": str(out / "model"),
        "cache_dir": str(out / "cache"),
        "log_severity_level": 3,
        "evaluate_input_model": False,
    }
    run(config)
    return sorted((out / "model").rglob("*.onnx"))[-1]


def optimum(model: Path, config_dir: Path, out: Path) -> Path:
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    work = out / "in"
    work.mkdir(parents=True)
    shutil.copyfile(model, work / "model.onnx")
    shutil.copyfile(config_dir / "config.json", work / "config.json")
    quantizer = ORTQuantizer.from_pretrained(work, file_name="model.onnx")
    config = AutoQuantizationConfig.arm64(is_static=False, per_channel=True)
    quantizer.quantize(save_dir=out / "q", quantization_config=config)
    return next((out / "q").glob("*.onnx"))


def main() -> int:
    recipe, model, calibration, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    out.mkdir(parents=True, exist_ok=True)
    if recipe == "optimum-dynamic":
        quantized = optimum(model, Path(sys.argv[5]), out)
    else:
        quantized = olive(recipe, model, calibration, out)
    print(quantized)
    return 0


if __name__ == "__main__":
    sys.exit(main())
