"""The 8×8 digits CNN: a real classifier that trains to ~99% in seconds on a CPU.

Data: ``sklearn.datasets.load_digits()`` (1,797 labelled images bundled with scikit-learn).
Model: conv-bn-relu ×2 + global pool + linear, about 40k parameters. It is the fast real
model every test tier, the demo and the benchmarks use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
INPUT_SHAPE = (1, 8, 8)


@dataclass(frozen=True)
class DigitsData:
    """Train/test split, images float32 NCHW in [0, 1], labels int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_data(seed: int = 0, test_fraction: float = 0.25) -> DigitsData:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return DigitsData(x[train], y[train], x[test], y[test])


def build_digits_cnn() -> Any:
    """The architecture (a fresh, untrained ``nn.Module``)."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def train_digits_cnn(data: DigitsData | None = None, *, epochs: int = 15, seed: int = 0) -> Any:
    """Train the CNN; returns the model in eval mode (deterministic for a given seed)."""
    import torch

    data = data or load_digits_data(seed)
    torch.manual_seed(seed)
    model = build_digits_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(data.x_train)
    y = torch.from_numpy(data.y_train)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
    return model.eval()


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.argmax(logits, axis=1) == labels).mean())


def export_onnx(model: Any, path: Path, opset: int = 17) -> Path:
    """Export with a dynamic batch axis; weights embedded (loadable from bytes)."""
    import torch

    example = torch.zeros(1, *INPUT_SHAPE)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset_version=opset,
        dynamo=False,
    )
    return path


@dataclass(frozen=True)
class DigitsArtifacts:
    """What :func:`prepare_digits` leaves in its directory."""

    directory: Path
    state_dict: Path
    onnx: Path
    calibration: Path  # npz with INPUT_NAME: 128 training images
    validation: Path  # npz with INPUT_NAME and "labels": the test split
    test_accuracy: float

    def load_model(self) -> Any:
        import torch

        model = build_digits_cnn()
        model.load_state_dict(torch.load(self.state_dict, weights_only=True))
        return model.eval()


def prepare_digits(directory: Path, *, seed: int = 0) -> DigitsArtifacts:
    """Train (once) and export the digits CNN into ``directory``; reuse what is already there."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / "digits_cnn.pt"
    onnx_path = directory / "digits_cnn.onnx"
    calib_path = directory / "calibration.npz"
    valid_path = directory / "validation.npz"
    meta_path = directory / "meta.json"
    paths = (state_path, onnx_path, calib_path, valid_path, meta_path)
    if all(p.exists() for p in paths):
        meta = json.loads(meta_path.read_text())
        return DigitsArtifacts(directory, state_path, onnx_path, calib_path, valid_path, meta["test_accuracy"])

    data = load_digits_data(seed)
    model = train_digits_cnn(data, seed=seed)
    with torch.no_grad():
        logits = model(torch.from_numpy(data.x_test)).numpy()
    test_acc = accuracy(logits, data.y_test)
    torch.save(model.state_dict(), state_path)
    export_onnx(model, onnx_path)
    np.savez(calib_path, **{INPUT_NAME: data.x_train[:128]})  # type: ignore[arg-type]
    np.savez(valid_path, **{INPUT_NAME: data.x_test, "labels": data.y_test})  # type: ignore[arg-type]
    meta_path.write_text(json.dumps({"test_accuracy": test_acc, "seed": seed}))
    return DigitsArtifacts(directory, state_path, onnx_path, calib_path, valid_path, test_acc)
