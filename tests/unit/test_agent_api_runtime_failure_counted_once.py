"""A model's run that fails is one refused request: a 500 counted once, as ``runtime``.

The server counts a failed run as ``runtime`` where it runs it (agent/serving.py); the answer
(agent/api/refusal.py) counts what is not the server's: a RuntimeBackendError is not counted
again. Any other exception out of the run (a runtime that does not translate its errors, a bug
in the variant's adaptation) is raised by the server as the RuntimeBackendError it counted, so
the answer does not count it ``internal`` as well (it did: two counts for one request)."""

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


def test_an_untranslated_runtime_exception_is_a_500_counted_once_as_runtime(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.CRITICAL, "edgesdk.agent.api"):
        assert failed_run_counts(ValueError("a runtime's own error")) == ([500], {"runtime": 1})


def test_a_model_not_served_is_counted_once_by_the_answer_not_by_the_server() -> None:
    """The server raises ModelNotFoundError and leaves the count to the answer: it counted
    ``not_found`` itself as well (twice for one request when a swap raced the API's lookup)."""
    from edgesdk.agent.serving import ModelNotFoundError

    app, metrics = make_app(FakeModel(1.0))
    try:
        with pytest.raises(ModelNotFoundError):
            app.server.infer_with_variant("gone", {"x": np.ones((1, 4), dtype=np.float32)})
        assert metrics.errors() == {}
        request = infer_request()
        request.path = "/v1/models/gone/infer"
        assert [a.status for a in run_requests(app, [request])] == [404]
        assert metrics.errors() == {"not_found": 1}
    finally:
        app.close()
