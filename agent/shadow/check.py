"""The shadow agreement criterion of probation: ``HealthCriteria.min_agreement`` held against
the lower bound of the worst output's agreement (docs/ota.md, "Shadow agreement").

* Judged only from :data:`MIN_SHADOW_SAMPLES` compared requests on.
* During the window it fails early only when even the upper bound of an agreement rate is
  below the minimum (the model is wrong, not merely unproven); at the window's end the lower
  bound must hold it.
* Asked for but not shown (no previous release to compare with, or too few compared
  requests by the end): the update fails closed with the reason. Not asked for, the figure is
  reported with the probation result and decides nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from edgesdk.agent.shadow.agreement import MIN_SHADOW_SAMPLES, Agreement, OutputAgreement
from edgesdk.agent.shadow.runner import ShadowRunner

#: ``HealthCriteria.shadow_rate`` when the deployment names none.
DEFAULT_SHADOW_RATE = 0.1


class ShadowCheck:
    """One probation's shadow: the runner (None when there is no reference, ``absent`` says why)."""

    def __init__(
        self,
        minimum: float | None,
        runner: ShadowRunner | None = None,
        *,
        absent: str | None = None,
        reference_release: int | None = None,
        window: str = "probation",
    ) -> None:
        self.minimum = minimum
        self.window = window  # "probation", or "the shadow phase" before activation: named in the reasons
        self.runner = runner
        self.absent = absent
        self.reference_release = reference_release
        #: Takes the runner's tap off the server (set by start_shadow).
        self.detach: Callable[[], None] = lambda: None

    @property
    def agreement(self) -> Agreement | None:
        return self.runner.agreement if self.runner is not None else None

    def breach(self, *, final: bool) -> str | None:
        """Why probation fails on agreement now, or None."""
        minimum = self.minimum
        if minimum is None:
            return None
        if self.runner is None:
            return f"shadow agreement cannot be checked ({self.absent}); the deployment asks min_agreement {minimum:g}"
        worst = self.runner.agreement.worst(minimum)
        samples = worst.samples if worst is not None else 0
        if worst is None or samples < MIN_SHADOW_SAMPLES:
            if not final:
                return None
            return (
                f"shadow agreement not shown: {samples} compared requests, at least {MIN_SHADOW_SAMPLES} needed "
                f"for min_agreement {minimum:g} ({self.runner.counts()}; raise shadow_rate or the {self.window}'s "
                f"length, or send traffic during {self.window})"
            )
        certain = worst.upper_bound is not None and worst.upper_bound < minimum
        if certain or (final and worst.lower_bound < minimum):
            return f"shadow agreement {worst.sentence()} < {minimum:g} ({self._which(worst)})"
        return None

    def summary(self) -> str:
        """The probation line's agreement part."""
        if self.runner is None:
            return f"no shadow: {self.absent}"
        worst = self.runner.agreement.worst(self.minimum)
        if worst is None:
            return f"shadow agreement n/a ({self.runner.counts()})"
        figure = worst.sentence().removesuffix(")")  # one parenthesis: the bound, what, the counts
        return f"shadow agreement {figure}; {self._which(worst)}; {self.runner.counts()})"

    def _which(self, worst: OutputAgreement) -> str:
        against = f" against release {self.reference_release}" if self.reference_release is not None else ""
        return f"{worst.name}: {worst.kind}{against}"

    def quiet(self) -> contextlib.AbstractContextManager[Any]:
        """Requests this thread makes inside the block (probation's probes) are not sampled."""
        return self.runner.quiet() if self.runner is not None else contextlib.nullcontext()

    def stop(self) -> None:
        """Tap off, then the worker stopped and joined: the reference is idle when this returns."""
        self.detach()
        if self.runner is not None:
            self.runner.stop()
