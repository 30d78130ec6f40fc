"""The reference profile's schema (numpy-free: the bundle manifest carries it, and the device's
unseal helper parses manifests without numpy). Built by :mod:`edgesdk.drift.profile`."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from edgesdk.schemas.base import Schema

#: Written by `edgesdk convert` next to report.json; `edgesdk package` signs it into the manifest.
PROFILE_FILE = "reference_profile.json"
#: Quantile bins per histogram (plus underflow and overflow).
BINS = 10
MAX_CHANNELS = 64
MAX_CLASSES = 1000
#: Every number of a profile together: ~1,500 for 64 channels, ~1,100 for 1000 classes; a
#: bigger one is refused (a bundle's manifest is read before anything else, at most 1 MiB).
MAX_NUMBERS = 8192
#: The profile file's size limit (a few KB in practice: 5.7 KB for 3 channels and 1000 classes).
MAX_PROFILE_BYTES = 256 * 1024


class Histogram(Schema):
    """Bins [edges[i], edges[i+1]) (the last closed), with underflow and overflow shares around them."""

    model_config = ConfigDict(allow_inf_nan=False)

    edges: list[float] = Field(min_length=2, max_length=BINS + 1)
    shares: list[float] = Field(description="underflow, one per bin, overflow: len(edges) + 1")

    @model_validator(mode="after")
    def _consistent(self) -> Histogram:
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("histogram edges must increase")
        if len(self.shares) != len(self.edges) + 1:
            raise ValueError(f"a histogram with {len(self.edges)} edges has {len(self.edges) + 1} shares")
        if any(s < 0 for s in self.shares) or not math.isclose(sum(self.shares), 1.0, abs_tol=1e-3):
            raise ValueError("histogram shares must be >= 0 and sum to 1")
        return self


class TensorProfile(Schema):
    model_config = ConfigDict(allow_inf_nan=False)

    ndim: int = Field(ge=0, le=8, description="rank of the tensor as the model is fed (batch axis included)")
    channel_axis: int | None = Field(None, lt=0, description="negative axis of the channels, None: one histogram")
    min: float
    max: float
    histograms: list[Histogram] = Field(min_length=1, max_length=MAX_CHANNELS, description="one per channel")
    classes: list[float] | None = Field(None, max_length=MAX_CLASSES, description="class shares (arg-max)")
    confidence: Histogram | None = Field(None, description="top-1 confidence (softmax when not probabilities)")
    softmax: bool = Field(False, description="confidence is taken after a softmax (the output is logits)")


class ReferenceProfile(Schema):
    """Signed into a bundle's manifest as ``reference`` (docs/bundle-format.md)."""

    model_config = ConfigDict(allow_inf_nan=False)

    format: Literal["edgesdk-reference-profile-v1"] = "edgesdk-reference-profile-v1"
    samples: int = Field(ge=1, description="validation samples it was computed from")
    inputs: dict[str, TensorProfile] = Field(max_length=64)
    outputs: dict[str, TensorProfile] = Field(max_length=64)

    @model_validator(mode="after")
    def _bounded(self) -> ReferenceProfile:
        numbers = sum(_numbers(t) for t in [*self.inputs.values(), *self.outputs.values()])
        if numbers > MAX_NUMBERS:
            raise ValueError(f"reference profile holds {numbers} numbers, over {MAX_NUMBERS}")
        return self


def _numbers(tensor: TensorProfile) -> int:
    hists = [*tensor.histograms, *([tensor.confidence] if tensor.confidence else [])]
    return 2 + sum(len(h.edges) + len(h.shares) for h in hists) + len(tensor.classes or [])
