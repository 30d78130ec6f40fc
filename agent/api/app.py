"""The local API's HTTP routes: the adapter between HTTP and the scheduler.

An inference route hands its work (decode, run through ``ModelServer``, encode) to the one
``Scheduler`` (``scheduler.py``: admission control, inline or pool, the deadline), which
replies with an ``Answer`` or an ``ErrorAnswer``; this module writes either as an HTTP response.
Requests whose header block has a prepared route (``prepared.py``) are answered before they
get here.

The Open Inference Protocol (KServe v2) routes live beside ``/v1`` (``/v2/...``, translated in
``open_inference``); their inferences take the same admission control and the same server path.

Status codes: 400 malformed body, 404 unknown route or model, 405 wrong method, 406/415
encodings, 408 slow client, 411 no Content-Length, 413 body too large or declaring arrays over
``max_decoded_bytes``, 422 the tensors do not match the model's signature (wrong dtype/shape,
NaN/Inf; checked on the declared sizes before anything is allocated), 500 the runtime failed,
503 overload or the memory budget for requests in flight full (Retry-After) or no model
loaded, 504 the request waited past ``request_timeout_s``. An error's status (and its gRPC code,
its error count, its Retry-After) is its class's (``refusal.py``): ``refuse`` answers any of them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from edgesdk.agent.api import open_inference, predict
from edgesdk.agent.api.answer import Answer
from edgesdk.agent.api.codec import media_type, response_encoding
from edgesdk.agent.api.http import KnownHead, Request, Respond, Response, field_lines, json_response
from edgesdk.agent.api.plan import route_plan
from edgesdk.agent.api.prepared import prepare
from edgesdk.agent.api.refusal import ErrorAnswer
from edgesdk.agent.api.scheduler import Scheduler
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelNotFoundError, ModelServer, NoModelError

from edgesdk.schemas.agent_config import ApiConfig

log = logging.getLogger("edgesdk.agent.api")

_INFER_PREFIX = "/v1/models/"
_INFER_SUFFIX = "/infer"
_INFER_PREFIX_LEN = len(_INFER_PREFIX)
_INFER_SUFFIX_AT = -len(_INFER_SUFFIX)
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


#: One protocol's inference: (server, request, what the path named) → its answer; raises the
#: errors refusal.py answers.
InferAnswer = Callable[[ModelServer, Request, Any], Answer]


def answer_v1(server: ModelServer, request: Request, model_name: str) -> Answer:
    """``POST /v1/models/{name}/infer`` in any of the codec's encodings: the model's plan for this
    head shape (plan.route_plan), its work on the body."""
    model = server.get_model(model_name)
    headers = request.headers
    content_type, encoding = encodings(headers.get("content-type"), headers.get("accept"))
    plan = route_plan(model, content_type, encoding, query=request.query, tensors_header=headers.get("x-tensors", ""))
    return plan.work(server, request.body, request.allowance)


def answer_v2(server: ModelServer, request: Request, route: open_inference.ModelRoute) -> Answer:
    """``POST /v2/models/{name}[/versions/{v}]/infer``: the model's plan for this head shape
    (open_inference.infer_plan), its work on the body."""
    plan = open_inference.infer_plan(open_inference.served_model(server, route), request.headers)
    return plan.work(server, request.body, request.allowance)


_ENCODINGS_SEEN: dict[tuple[str | None, str | None], tuple[str, str]] = {}


def encodings(content_type_header: str | None, accept_header: str | None) -> tuple[str, str]:
    """(request media type, response encoding) of a Content-Type and an Accept header; raises
    UnsupportedEncodingError (406) for an Accept the API cannot answer. Remembered per header
    pair: a client sends the same two with every request, and parsing them costs as much as
    the rest of a tiny model's routing."""
    key = (content_type_header, accept_header)
    known = _ENCODINGS_SEEN.get(key)
    if known is None:
        content_type = media_type(content_type_header)
        known = (content_type, response_encoding(accept_header, content_type or "application/json"))
        if len(_ENCODINGS_SEEN) < 256:  # bounded: header values are the client's to choose
            _ENCODINGS_SEEN[key] = known
    return known


class ApiApp:
    """The HTTP routes. ``handle`` is the HTTP server's handler; inferences go to ``scheduler``."""

    def __init__(
        self,
        server: ModelServer,
        metrics: Metrics,
        config: ApiConfig,
        *,
        status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.server = server
        self.metrics = metrics
        self.config = config
        self.status = status or (lambda: {})
        self.scheduler = Scheduler(server, metrics, config)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.scheduler.loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.scheduler.loop = loop

    @property
    def in_flight(self) -> int:
        """Requests running or waiting now."""
        return self.scheduler.in_flight

    def handle(self, request: Request, respond: Respond) -> None:
        """The HTTP server's handler: every request's generic path (routing, then the route's
        own checks). Requests whose header block has a prepared route (agent/api/prepared.py)
        are answered by that first when it can; the HTTP server brings here what it declines."""
        path = request.path
        if path.startswith(_INFER_PREFIX) and path.endswith(_INFER_SUFFIX):
            if request.method == "POST" or self._method_allowed(request, "POST", respond):
                self._infer(request, respond, answer_v1, path[_INFER_PREFIX_LEN:_INFER_SUFFIX_AT])
            return
        if path.startswith(_INFER_PREFIX) and path.endswith(predict.SUFFIX):  # the bundle's pipeline around infer
            if request.method == "POST" or self._method_allowed(request, "POST", respond):
                self._infer(request, respond, predict.answer_predict, path[_INFER_PREFIX_LEN : -len(predict.SUFFIX)])
            return
        if path.startswith(open_inference.MODELS_PREFIX):
            self._v2_model_route(request, respond)
            return
        route = _GET_ROUTES.get(path)
        if route is None:
            self._no_route(path, respond)
            return
        if self._method_allowed(request, "GET", respond):
            respond(route(self))

    def _method_allowed(self, request: Request, allowed: str, respond: Respond) -> bool:
        if request.method == allowed or (allowed == "GET" and request.method == "HEAD"):
            return True
        respond(json_response(405, {"error": f"{request.method} not allowed; use {allowed}"}, [("Allow", allowed)]))
        return False

    def _no_route(self, path: str, respond: Respond) -> None:
        self.metrics.count_error("not_found")
        respond(json_response(404, {"error": f"no route {path!r}"}))

    # -- GET routes -----------------------------------------------------------------------------

    def healthz(self) -> Response:
        return Response(200, b'{"status":"ok"}')

    def readyz(self) -> Response:
        running = self.server.running_model()
        if running is None:
            return json_response(503, {"ready": False, "reason": "no model loaded"})
        return json_response(200, {"ready": True, "model": running.name, "variant": running.variant})

    def models(self) -> Response:
        return json_response(200, {"models": self.server.describe_models()})

    def status_route(self) -> Response:
        return json_response(200, self.status())

    def metrics_route(self) -> Response:
        return Response(200, self.metrics.prometheus().encode(), content_type=PROMETHEUS_TYPE)

    # -- Open Inference Protocol (v2) ------------------------------------------------------------

    def v2_server_metadata(self) -> Response:
        return json_response(200, open_inference.server_metadata())

    def v2_live(self) -> Response:
        return Response(200, b'{"live":true}')

    def v2_ready(self) -> Response:
        if self.server.running_model() is None:
            return json_response(503, {"ready": False, "error": "no model loaded"})
        return Response(200, b'{"ready":true}')

    def _v2_model_route(self, request: Request, respond: Respond) -> None:
        route = open_inference.parse_model_route(request.path)
        if route is None:
            self._no_route(request.path, respond)
        elif route.action == "infer":
            if self._method_allowed(request, "POST", respond):
                self._infer(request, respond, answer_v2, route)
        elif self._method_allowed(request, "GET", respond):
            try:
                respond(json_response(200, _V2_MODEL_GETS[route.action](self.server, route)))
            except (ModelNotFoundError, NoModelError) as exc:
                respond(self.refuse(exc, request.path))

    # -- inference --------------------------------------------------------------------------------

    def _infer(self, request: Request, respond: Respond, answer: InferAnswer, target: Any) -> None:
        """``answer(server, request, target)`` through the scheduler, its outcome as a response."""

        def reply(outcome: Answer | ErrorAnswer) -> None:
            respond(http_response(outcome))

        outcome = self.scheduler.submit(
            functools.partial(answer, self.server, request, target),
            reply,
            size=len(request.body),
            may_inline=answer is not predict.answer_predict,  # image decoding never blocks the loop
            where=request.path,
        )
        known = request.known
        if known is not None and not known.settled and type(outcome) is Answer and answer is answer_v1:
            self._prepare(known, request, target)  # answered 200 inline: its block may get a prepared route

    def _prepare(self, known: KnownHead, request: Request, model_name: str) -> None:
        """Give ``known`` (the header block of ``request``, just answered 200 inline) its
        prepared route, or settle that it has none (for good: what rules one out is the block
        itself, or the agent's configuration; a plan whose model is swapped unsettles it)."""
        headers = request.headers
        content_type, encoding = encodings(headers.get("content-type"), headers.get("accept"))
        known.route = prepare(self, request, model_name, content_type, encoding)
        known.settled = True

    def refuse(self, exc: BaseException, where: str = "") -> Response:
        """``exc`` answered and counted as its class says (agent/api/refusal.py)."""
        return http_response(self.scheduler.refuse(exc, where))

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no request is running or queued (SIGTERM); False on timeout."""
        return await self.scheduler.drain(timeout_s)

    def close(self) -> None:
        self.scheduler.close()


def http_response(outcome: Answer | ErrorAnswer) -> Response:
    """An answer as a 200, a refusal as its status with ``{"error": message}`` (and Retry-After)."""
    if type(outcome) is Answer:
        return Response(200, outcome.body, outcome.content_type, outcome.headers, field_lines(outcome.fields))
    refusal: ErrorAnswer = outcome  # type: ignore[assignment]
    retry = [("Retry-After", str(refusal.retry_after))] if refusal.retry_after is not None else None
    return json_response(refusal.http_status, {"error": refusal.message}, retry)


_GET_ROUTES: dict[str, Callable[[ApiApp], Response]] = {
    "/healthz": ApiApp.healthz,
    "/readyz": ApiApp.readyz,
    "/v1/models": ApiApp.models,
    "/v1/status": ApiApp.status_route,
    "/metrics": ApiApp.metrics_route,
    "/v2": ApiApp.v2_server_metadata,
    "/v2/health/live": ApiApp.v2_live,
    "/v2/health/ready": ApiApp.v2_ready,
}
#: GET /v2/models/{name}[/versions/{v}][/ready] by the route's action (infer is the POST).
_V2_MODEL_GETS: dict[str, Callable[[ModelServer, open_inference.ModelRoute], dict[str, Any]]] = {
    "metadata": open_inference.model_metadata_document,
    "ready": open_inference.model_ready,
}
