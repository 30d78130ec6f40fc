"""``edgesdk demo``: the whole story, locally, on embedded defaults.

Today it runs the digits model round trip: train the CNN, export it to ONNX, load the
bytes into the agent's onnxruntime backend (from memory, as a device would) and check
that the device-side predictions agree with PyTorch on the held-out test set.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click
import numpy as np

from edgesdk.cli.output import console, print_json, print_table, profiles_dirs
from edgesdk.errors import EdgeSDKError
from edgesdk.profiles import get_profile


@click.command()
@click.option("--profile", "profile_name", default="rpi5-8gb", show_default=True, help="Device profile to target.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), help="Keep artifacts here.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def demo(ctx: click.Context, profile_name: str, workdir: Path | None, as_json: bool) -> None:
    """Run the local end-to-end demo."""
    profile = get_profile(profile_name, profiles_dirs(ctx))
    try:
        import torch

        from edgesdk.workloads.digits import INPUT_NAME, OUTPUT_NAME, accuracy, prepare_digits
    except ImportError as exc:
        raise EdgeSDKError(
            f"the demo needs the converter extra: pip install 'edgesdk[all]' ({exc.name} missing)"
        ) from exc
    from edgesdk.agent.runtimes import load_model

    out = console()
    with tempfile.TemporaryDirectory(prefix="edgesdk-demo-") as tmp:
        root = workdir or Path(tmp)
        with out.status("training the digits CNN and exporting ONNX…"):
            artifacts = prepare_digits(root / "digits")
        validation = np.load(artifacts.validation)
        images, labels = validation[INPUT_NAME], validation["labels"]
        with torch.no_grad():
            reference = artifacts.load_model()(torch.from_numpy(images)).numpy()
        device_model = load_model("onnxruntime", artifacts.onnx.read_bytes())
        device_out = device_model.run({INPUT_NAME: images})[OUTPUT_NAME]
        summary: dict[str, Any] = {
            "profile": profile.name,
            "device": profile.display_name,
            "onnx_bytes": artifacts.onnx.stat().st_size,
            "torch_accuracy": accuracy(reference, labels),
            "onnxruntime_accuracy": accuracy(device_out, labels),
            "top1_agreement": float((reference.argmax(1) == device_out.argmax(1)).mean()),
            "max_abs_diff": float(np.abs(reference - device_out).max()),
            "test_images": int(len(labels)),
        }
    if as_json:
        print_json(summary)
        return
    print_table(
        f"digits CNN round trip for {profile.display_name}",
        ["step", "result"],
        [
            ("PyTorch accuracy (test split)", f"{summary['torch_accuracy']:.2%}"),
            ("ONNX size", f"{summary['onnx_bytes'] / 1024:.0f} KiB"),
            ("onnxruntime accuracy (loaded from memory)", f"{summary['onnxruntime_accuracy']:.2%}"),
            ("top-1 agreement torch vs device", f"{summary['top1_agreement']:.2%}"),
            ("max |diff| of logits", f"{summary['max_abs_diff']:.2e}"),
        ],
    )
