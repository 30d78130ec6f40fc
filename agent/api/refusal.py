"""How an error that reaches a client is answered, whatever the transport: one table, on the classes.

Like Starlette's exception handlers, but as class attributes: every ``AgentError`` carries its
HTTP status, its gRPC status code's name, the kind the error counter counts it as (None:
counted where it was raised), its Retry-After and whether its message is shown
(``edgesdk/errors.py``, ``AgentError``). The base class is an unexpected failure: 500/INTERNAL,
counted ``internal``, its message hidden (only its type is named). Any other exception is
answered the same way. The HTTP adapter turns an :class:`ErrorAnswer` into a JSON error; the gRPC one
into ``context.abort(code, message)``.

Counted once, whatever the route: ``Scheduler.refuse`` counts every refusal by its kind, except
the two the server counts where it checks and runs (``agent/serving.py``): InferenceInputError
and RuntimeBackendError, which therefore no API module raises itself (DeclaredInputError does;
tests/unit/test_agent_api_raises_counted_errors.py). What never reaches a handler is counted where
it is refused: whatever the HTTP server refuses itself (``HttpProtocol._fail``: 400, 411, 413,
431 bad_request, 408 slow_client, 503 overload) and an RPC the gRPC server does not serve
(UNIMPLEMENTED, not_found, as a route the HTTP API lacks); not a gRPC message over the size
limit, which grpc refuses itself (RESOURCE_EXHAUSTED).
tests/integration/test_agent_refusals_counted.py sends each refusal over each route.

=====================================  ======  ===================  ===========  ===========
error (where it is defined)            HTTP    gRPC                 counted as   Retry-After
=====================================  ======  ===================  ===========  ===========
DecodeError (codec.py)                 400     INVALID_ARGUMENT     bad_request
ModelNotFoundError (serving.py)        404     NOT_FOUND            not_found
UnsupportedEncodingError (codec.py)    406/415 INVALID_ARGUMENT     bad_request
BudgetRefused (budget.py)              413     RESOURCE_EXHAUSTED   bad_request
BudgetRefused, the budget full now     503     UNAVAILABLE          overload     its own
InferenceInputError (errors.py)        422     INVALID_ARGUMENT     (the server)
DeclaredInputError (codec.py)          422     INVALID_ARGUMENT     bad_input  (the API's own)
DecodedValueError (codec.py)           422     INVALID_ARGUMENT     bad_input
RuntimeBackendError (errors.py)        500     INTERNAL             (the server)
AgentError, any other exception        500     INTERNAL             internal
AtCapacityError (here)                 503     UNAVAILABLE          overload     1
NoModelError (serving.py)              503     UNAVAILABLE          no_model     5
AgentStoppingError (here)              503     UNAVAILABLE          (not)        1
AnswerTimeoutError (here)              504     DEADLINE_EXCEEDED    timeout
QueueExpiredError (here)               504     DEADLINE_EXCEEDED    (its timer)
=====================================  ======  ===================  ===========  ===========
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edgesdk.errors import AgentError, RuntimeBackendError

log = logging.getLogger("edgesdk.agent.api")


class AtCapacityError(AgentError):
    """``max_concurrency`` requests run and ``max_queue`` more wait: retry shortly."""

    http_status, grpc_status, error_kind, public = 503, "UNAVAILABLE", "overload", True
    retry_after = 1


class AgentStoppingError(AgentError):
    """The agent is stopping: its loop or pool no longer takes requests."""

    http_status, grpc_status, error_kind, public = 503, "UNAVAILABLE", None, True
    retry_after = 1


class AnswerTimeoutError(AgentError):
    """No answer within ``request_timeout_s``."""

    http_status, grpc_status, public = 504, "DEADLINE_EXCEEDED", True
    error_kind: str | None = "timeout"


class QueueExpiredError(AnswerTimeoutError):
    """A request that waited in the queue past ``request_timeout_s``: its timer has answered and
    counted it already."""

    error_kind = None


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error as any transport answers it."""

    http_status: int
    grpc_status: str
    message: str
    error_kind: str | None
    retry_after: float | None


def refusal_of(exc: BaseException, where: str = "") -> ErrorAnswer:
    """``exc`` as its answer (see the module's table); logs the failures that are the agent's:
    a hidden one with its traceback, a runtime's (shown, 500) as one line. ``where`` names the
    request in the log."""
    # Not one of ours (a bug, a library's error): answered as the base class says.
    carrier: AgentError | RuntimeBackendError | type[AgentError] = (
        exc if isinstance(exc, (AgentError, RuntimeBackendError)) else AgentError
    )
    if carrier.public:
        message = str(exc)
        if carrier.http_status == 500:
            log.error("runtime failed on %s: %s", where, exc)
    else:
        message = f"internal error: {type(exc).__name__}"
        log.error("inference on %s failed", where, exc_info=exc)
    return ErrorAnswer(carrier.http_status, carrier.grpc_status, message, carrier.error_kind, carrier.retry_after)
