"""The demo's models: the digits CNN (v1, v2) and a deliberately slow build of it (v3).

The slow build is the same network with an expensive side branch (a stack of 3x3
convolutions over an upsampled copy of the input) whose result barely touches the logits:
it is accurate, passes every conversion gate and the device's smoke test, and still breaks
a latency SLO in probation — the kind of regression a canary exists to catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Side-branch size: about 0.9 GFLOP per image, tens of milliseconds per image on one fast CPU core
#: (the SLO is 10 ms per request; the digits CNN answers in well under one).
SLOW_CHANNELS = 32
SLOW_LAYERS = 12
SLOW_UPSAMPLE = 8


def build_slow_digits(base: Any) -> Any:
    """``base`` (the trained digits CNN) plus a costly branch that hardly changes its outputs."""
    import torch
    from torch import nn

    class SlowDigits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = base
            self.stem = nn.Conv2d(1, SLOW_CHANNELS, 3, padding=1)
            self.body = nn.Sequential(
                *[
                    layer
                    for _ in range(SLOW_LAYERS)
                    for layer in (nn.Conv2d(SLOW_CHANNELS, SLOW_CHANNELS, 3, padding=1), nn.ReLU())
                ]
            )

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            logits = self.base(image)
            wide = nn.functional.interpolate(image, scale_factor=SLOW_UPSAMPLE, mode="nearest")
            side = self.body(self.stem(wide)).mean(dim=(1, 2, 3))
            # Scaled to ~1e-6 of the logits: outputs (and top-1) stay the base model's.
            return logits + 1e-6 * torch.tanh(side).unsqueeze(1)

    torch.manual_seed(0)
    return SlowDigits().eval()


def export_slow_digits(digits: Any, path: Path) -> Path:
    """Export the slow build of the trained digits CNN (``DigitsArtifacts``) to ONNX."""
    from edgesdk.workloads.digits import export_onnx

    return export_onnx(build_slow_digits(digits.load_model()), path)
