"""Why each variant of a bundle is or is not loaded here: what ``/v1/models`` and ``/v1/status`` list.

A bundle carries variants for many devices (ONNX, OpenVINO, TFLite at several precisions);
the agent loads one per precision, the profile's preferred runtime first. Every other variant
gets the reason it was passed over, so "served from ONNX only" always comes with why:
not for this profile, failed its accuracy gate, did not load (its runtime not installed, a
corrupt file), or another variant of that precision comes first in the profile's runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgesdk.schemas.manifest import Variant
from edgesdk.schemas.profile import DeviceProfile


def _text(value: object) -> str:
    return str(getattr(value, "value", value))


@dataclass(frozen=True)
class VariantChoice:
    """One variant of the bundle: loaded, or the reason it is not."""

    id: str
    format: str
    runtime: str
    precision: str
    loaded: bool
    reason: str
    #: What a loaded variant runs on (ExecutionReport.describe()), with the fallback's reason.
    execution: dict[str, Any] | None = None

    def describe(self, active: str | None) -> dict[str, Any]:
        described = {
            "id": self.id,
            "format": self.format,
            "runtime": self.runtime,
            "precision": self.precision,
            "loaded": self.loaded,
            "active": self.id == active,
            "reason": self.reason,
        }
        if self.execution is not None:
            described["execution"] = self.execution
        return described


class VariantChoices:
    """Collects the choice of every variant while ``ModelServer.swap`` loads a bundle."""

    def __init__(self, profile: DeviceProfile | None, variants: list[Variant]) -> None:
        self.profile = profile
        self._variants = list(variants)
        self._by_id: dict[str, VariantChoice] = {}

    def _set(self, meta: Variant, loaded: bool, reason: str, execution: dict[str, Any] | None = None) -> None:
        self._by_id[meta.id] = VariantChoice(
            meta.id, _text(meta.format), _text(meta.runtime), _text(meta.precision), loaded, reason, execution
        )

    def loaded(self, meta: Variant, rank: int, execution: Any = None) -> None:
        """``execution``: the loaded model's ExecutionReport, if its backend gives one."""
        why = f"loaded: the {_text(meta.precision)} step of the ladder"
        if self.profile is not None:
            why += f" ({_text(meta.runtime)} is #{rank + 1} of {self.profile.name}'s runtimes that has one)"
        if execution is not None and execution.fallback:
            why += f"; {execution.fallback}"
        self._set(meta, True, why, execution.describe() if execution is not None else None)

    def failed_gate(self, meta: Variant) -> None:
        self._set(meta, False, "failed its accuracy gate when it was packaged")

    def unvalidated(self, meta: Variant) -> None:
        self._set(meta, False, "unvalidated: never run where it was converted, so never on the ladder")

    def size_step_only(self, meta: Variant) -> None:
        self._set(meta, False, "a size step only: not faster than its fp32 where it was timed")

    def not_faster_here(self, meta: Variant) -> None:
        self._set(
            meta, False, "not a step on this device: edge-agent profile measured it no faster than the step above"
        )

    def not_for_profile(self, meta: Variant) -> None:
        formats = ", ".join(_text(f) for f in self.profile.formats) if self.profile else "?"
        name = self.profile.name if self.profile else "this device"
        self._set(meta, False, f"not for this profile: {name} runs {formats}")

    def did_not_load(self, meta: Variant, error: Exception) -> None:
        self._set(meta, False, f"did not load: {error}")

    def passed_over(self, meta: Variant, chosen: Variant) -> None:
        order = f" ({_text(chosen.runtime)} comes first in {self.profile.name}'s runtimes)" if self.profile else ""
        self._set(
            meta, False, f"{chosen.id} serves {_text(meta.precision)}{order}; one variant per precision is loaded"
        )

    def result(self) -> tuple[VariantChoice, ...]:
        """In the bundle's order; a variant nothing was said about was not tried."""
        for meta in self._variants:
            if meta.id not in self._by_id:
                self._set(meta, False, "not tried")
        return tuple(self._by_id[v.id] for v in self._variants)
