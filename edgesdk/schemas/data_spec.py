"""The data spec: how a model's calibration/validation arrays are laid out, as a file.

``edgesdk convert --data-spec spec.yaml`` reads it; ``--batch-axis`` and ``--state`` flags
given too win over it, name by name::

    schema_version: 1
    batch_axes: {state: 1, sr: none}   # the axis holding the samples, or none: a constant
    state: {state: stateN}             # a stateful model's state input → next-state output
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema


class DataSpec(Schema):
    """Where each tensor's samples are, and which inputs carry state, for ``edgesdk convert``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    batch_axes: dict[str, int | Literal["none"]] = Field(
        default_factory=dict, description="tensor name → the axis holding the samples, or none (a constant)"
    )
    state: dict[str, str] = Field(
        default_factory=dict, description="state input → the output carrying it to the next step"
    )
