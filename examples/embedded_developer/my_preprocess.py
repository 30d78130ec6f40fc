"""The user's current pipeline for the digits CNN, written the usual way (Pillow + numpy +
onnxruntime): the reference ``classifier_pipeline.sh`` validates the bundle's pipeline against
(``edgesdk convert --reference my_preprocess.py:predict``). DIGITS_ONNX names the model file."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
from PIL import Image

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SESSION = ort.InferenceSession(os.environ["DIGITS_ONNX"], providers=["CPUExecutionProvider"])


def predict(path: str) -> tuple[str, float]:
    """One image file → (label, probability)."""
    image = Image.open(path).convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    x = (np.asarray(image, dtype=np.float32) / 255.0)[None, None]
    logits = SESSION.run(None, {"image": x})[0][0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return LABELS[int(p.argmax())], float(p.max())
