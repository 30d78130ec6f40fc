"""The demo's digits as real files: the test split as PNGs, and the bundle's pipeline that
turns a PNG into the CNN's input and its logits into labels (issue 42: the demo sends files).

Without Pillow (the ``pipeline`` extra) neither side can decode an image: the bundles then ship
without a pipeline and the traffic posts tensors, as before."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

LABELS = [str(digit) for digit in range(10)]


def digits_png_pipeline() -> Any:
    """The signed pipeline of the demo's digits bundles; None where Pillow is missing."""
    try:
        import PIL  # noqa: F401 - only asked whether the decoder is there
    except ImportError:
        return None
    from edgesdk.schemas.pipeline import Pipeline

    return Pipeline.model_validate(
        {
            "input": "image",
            # The 8x8 grey digits as they are; pixels in [0, 1] as the CNN was trained.
            "image": {
                "color": "L",
                "resize": {"height": 8, "width": 8},
                "scale": 1 / 255,
                "layout": "NCHW",
                "max_pixels": 1_000_000,  # a bigger file is refused by its declared size
            },
            "post": {"activation": "softmax", "top_k": 1, "labels": LABELS},
        }
    )


def digit_pngs(images: np.ndarray) -> list[bytes]:
    """Each (1, 8, 8) image in [0, 1] as a lossless 8x8 greyscale PNG file."""
    from PIL import Image

    files = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(np.rint(image[0] * 255).astype(np.uint8), mode="L").save(buffer, format="PNG")
        files.append(buffer.getvalue())
    return files
