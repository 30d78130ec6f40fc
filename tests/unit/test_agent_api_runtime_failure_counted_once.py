"""A model's run that fails is one refused request: a 500 counted once, as ``runtime``.

The server counts a failed run as ``runtime`` where it runs it (agent/serving.py); the answer
(agent/api/refusal.py) counts what is not the server's: a RuntimeBackendError is not counted
again. Any other exception out of the run (a runtime that does not translate its errors, a bug
in the variant's adaptation) is also counted ``internal`` by the answer: two counts for one
request, until the server marks or translates what it counted (a change in agent/serving.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from tests.unit.test_agent_api_app import infer_request, make_app, run_requests
from tests.unit.test_agent_serving import FakeModel


class FailingModel(FakeModel):
    def __init__(self, error: Exception) -> None:
        super().__init__(1.0)
        self.error = error

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise self.error


def failed_run_counts(error: Exception) -> tuple[list[int], dict[str, int]]:
    app, metrics = make_app(FailingModel(error))
    try:
        answers = run_requests(app, [infer_request()])
    finally:
        app.close()
    return [answer.status for answer in answers], metrics.errors()


def test_a_runtime_backend_error_is_a_500_counted_once_as_runtime(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.CRITICAL, "edgesdk.agent.api"):
        assert failed_run_counts(RuntimeBackendError("device lost")) == ([500], {"runtime": 1})


@pytest.mark.xfail(
    strict=True,
    reason="counted twice (runtime by the server, internal by the answer): agent/serving.py must mark or "
    "translate a run's untranslated exception it has counted",
)
def test_an_untranslated_runtime_exception_is_a_500_counted_once_as_runtime(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.CRITICAL, "edgesdk.agent.api"):
        assert failed_run_counts(ValueError("a runtime's own error")) == ([500], {"runtime": 1})
