"""The device's model memory budget, checked at install across every model it serves.

A variant's load size is what the converter's validation measured: the peak RSS growth while
it loaded and ran the variant (``Variant.load_rss_mb`` in the manifest). A bundle without that
figure (packaged before it was recorded, or a variant that could not run on the packaging host)
counts its plaintext size instead, a lower bound: the runtime holds at least the weights.

A bundle's load size is what the model server would hold of it: one variant per precision (the
ladder; the largest of a precision's candidates, since which runtime wins depends on the
device), of the variants that passed their gate and are not ``off``. An install is admitted
when that fits in the profile's ``model_ram_budget_mb`` minus what the *other* models serving
now hold. The model being replaced is not counted: its memory is released once the new version
took over (during the switch both are resident for a moment, and during probation the previous
version is kept loaded so a rollback is instant; see docs/agent.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edgesdk.errors import AgentError

_MB = float(1 << 20)


class ModelRamBudgetError(AgentError):
    """An install would not fit in the device's model memory budget beside the models it serves."""


def variant_load_mb(variant: Any) -> float:
    """One variant's load size: measured at conversion, else its plaintext size."""
    measured = getattr(variant, "load_rss_mb", None)
    return float(measured) if measured is not None else variant.size / _MB


def _ladder_load_mb(variants: Iterable[Any]) -> float:
    per_precision: dict[str, float] = {}
    for v in variants:
        key = str(getattr(v.precision, "value", v.precision))
        per_precision[key] = max(per_precision.get(key, 0.0), variant_load_mb(v))
    return sum(per_precision.values())


def bundle_load_mb(manifest: Any) -> float:
    """What serving this bundle would hold (MB): one variant per precision that may serve."""
    from edgesdk.agent.serving import gate_passed

    return _ladder_load_mb(v for v in manifest.variants if gate_passed(v) and v.ladder_role != "off")


def served_load_mb(model: Any) -> float:
    """What a served model holds (MB): the load sizes of the variants it loaded."""
    return _ladder_load_mb(v.meta for v in model.ladder)


class ModelRamBudget:
    """``model_ram_budget_mb`` of the device profile, shared by every model."""

    def __init__(self, budget_mb: float, profile_name: str) -> None:
        self.budget_mb = float(budget_mb)
        self.profile_name = profile_name

    def check(self, manifest: Any, resident: Mapping[str, float]) -> None:
        """ModelRamBudgetError (one line, with the figures) when ``manifest`` does not fit beside ``resident``."""
        need = bundle_load_mb(manifest)
        used = sum(resident.values())
        free = self.budget_mb - used
        if need <= free:
            return
        held = ", ".join(f"{name} {mb:.1f} MB" for name, mb in sorted(resident.items())) or "none"
        model = manifest.model
        raise ModelRamBudgetError(
            f"model {model.name} {model.version} needs {need:.1f} MB to load but only {free:.1f} MB of the "
            f"{self.budget_mb:.0f} MB model budget of profile {self.profile_name} is free ({used:.1f} MB resident: "
            f"{held}); not installed"
        )
