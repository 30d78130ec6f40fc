"""The routes of the local API and its admission control.

At most ``max_concurrency`` inferences run at once (the size of the thread pool) and at
most ``max_queue`` more wait; beyond that a request is answered 503 with ``Retry-After``
at once, so a flood costs a few microseconds per refused request and never unbounded
memory. Decoding, inference and encoding run in the pool, so a large JSON body cannot stall
other connections. One exception: when recent requests took less than ``inline_max_ms`` (a
tiny model; the shortest of the last eight, so preempted runs do not count), a small
request is answered on the event loop itself, because the two thread hops would cost more
than the inference (with dynamic batching on, only when nothing else is in flight).

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
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from edgesdk.agent.api import open_inference, predict
from edgesdk.agent.api.codec import (
    decode_request,
    encode_response,
    media_type,
    response_encoding,
)
from edgesdk.agent.api.http import KnownHead, Request, Respond, Response, json_response
from edgesdk.agent.api.prepared import prepare
from edgesdk.agent.api.refusal import (
    AgentStoppingError,
    AnswerTimeoutError,
    AtCapacityError,
    QueueExpiredError,
    refusal_of,
)
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelNotFoundError, ModelServer, NoModelError

from edgesdk.schemas.agent_config import ApiConfig

log = logging.getLogger("edgesdk.agent.api")

_INFER_PREFIX = "/v1/models/"
_INFER_SUFFIX = "/infer"
_INFER_PREFIX_LEN = len(_INFER_PREFIX)
_INFER_SUFFIX_AT = -len(_INFER_SUFFIX)
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Bodies above this always go to the pool (decoding alone could block the loop).
_INLINE_MAX_BODY = 64 * 1024
#: Answers in a row at or over inline_max_s that send a tiny model's next requests to the pool.
_INLINE_RUNS = 8


#: One protocol's inference: (server, request, what the path named) → the 200 response; raises
#: the errors ``ApiApp._answer`` turns into status codes.
InferAnswer = Callable[[ModelServer, Request, Any], Response]


def answer_v1(server: ModelServer, request: Request, model_name: str) -> Response:
    """``POST /v1/models/{name}/infer`` in any of the codec's encodings."""
    model = server.get_model(model_name)
    headers = request.headers
    content_type, encoding = encodings(headers.get("content-type"), headers.get("accept"))
    feeds = decode_request(
        content_type, request.body, request.headers, request.query, model.signature, request.allowance
    )
    outputs, variant = server.infer_with_variant(model_name, feeds)
    body, headers = encode_response(
        encoding, outputs, model=model.name, version=model.version, variant=variant, query=request.query
    )
    headers.append(("X-Model-Variant", variant))
    response = Response(200, body, content_type=encoding, headers=headers)
    if server.taps:
        response.served = (model.name, feeds, outputs, variant)
    return response


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
    """Routes + admission control. ``handle`` is the HTTP server's handler."""

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
        # Requests waiting in a filling batch hold a thread each (agent/batching.py).
        threads = config.batching.pool_threads(config.max_concurrency)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="infer")
        self.capacity = config.max_concurrency + config.max_queue
        # Running + waiting, counted only on the event loop thread; the metrics' own counter,
        # so /metrics and telemetry report exactly what admission control sees (queue_depth).
        self.requests = metrics.requests
        self.inline_max_s = config.inline_max_ms / 1000.0
        # Slow answers still allowed before the pool takes over (see took); 0 until a run is
        # measured, so the first goes to the pool.
        self.inline_left = 0
        self._slow_s = 10 * self.inline_max_s
        self._slow_last = False  # the last slow answer took over _slow_s
        # With dynamic batching a request waits for others in the batcher: never on the loop
        # beside requests in the pool (the loop would wait for a batch it keeps from filling).
        batching = config.batching
        self.inline_beside_others = not (batching.enabled or any(m.enabled for m in batching.models.values()))
        # Requests of a tiny model that one wake-up of the loop brings, run as one batch (prepared.py).
        self.inline_batch_max = config.inline_batch_max
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Event | None = None

    @property
    def in_flight(self) -> int:
        """Requests running or waiting now."""
        return self.requests.count

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
                self._infer(request, respond, open_inference.answer_infer, route)
        elif self._method_allowed(request, "GET", respond):
            try:
                respond(_V2_MODEL_GETS[route.action](self.server, route))
            except (ModelNotFoundError, NoModelError) as exc:
                respond(self.refuse(exc, request.path))

    # -- inference --------------------------------------------------------------------------------

    def _infer(self, request: Request, respond: Respond, answer: InferAnswer, target: Any) -> None:
        """Admission control around ``answer(server, request, target)`` (inline or in the pool)."""
        if self.requests.count >= self.capacity:
            respond(self.refuse(AtCapacityError("agent is at capacity; retry shortly")))
            return
        requests = self.requests
        if (
            self.inline_left
            and len(request.body) <= _INLINE_MAX_BODY
            and (requests.count == 0 or self.inline_beside_others)
            and answer is not predict.answer_predict  # image decoding never blocks the loop
        ):
            # This model answers in well under a millisecond: the two thread hops would cost
            # more than the inference, and blocking the loop this briefly delays nobody. Also
            # while others are in the pool: else, once a preempted run had sent some there,
            # sixteen busy clients kept every request in the pool (count never back to 0),
            # at ~2x the CPU per answer. (No queue, so no expiry check: it starts now.)
            requests.count += 1
            started = time.perf_counter()
            try:
                response = self._answer(request, answer, target)
            finally:
                requests.count -= 1
            took = time.perf_counter() - started
            respond(response)  # first: what follows is bookkeeping the client need not wait for
            if response.served is not None:
                self.server.tap(*response.served)
            # (No drain() wake-up: the count is back where it was before this request, all in
            # one callback of the loop; drain() is woken by _finish, the pool's answers.)
            self.took(took)
            known = request.known
            if known is not None and not known.settled and response.status == 200 and answer is answer_v1:
                self._prepare(known, request, target)
            return
        requests.count += 1
        future = self.pool.submit(self._work, request, answer, target, time.monotonic())
        loop = self.loop or asyncio.get_running_loop()
        timer = loop.call_later(self.config.request_timeout_s, self._too_late, respond)

        def done(fut: Future[Response]) -> None:
            # Runs in the worker thread: hop back onto the loop to touch the transport.
            loop.call_soon_threadsafe(self._finish, fut, respond, timer)

        future.add_done_callback(done)

    def _prepare(self, known: KnownHead, request: Request, model_name: str) -> None:
        """Give ``known`` (the header block of ``request``, just answered 200 inline) its
        prepared route, or settle that it has none (for good: what rules one out is the block
        itself, or the agent's configuration; a plan whose model is swapped unsettles it)."""
        headers = request.headers
        content_type, encoding = encodings(headers.get("content-type"), headers.get("accept"))
        known.route = prepare(self, request, model_name, content_type, encoding)
        known.settled = True

    def infer_from_thread(self, request: Request, answer: InferAnswer, target: Any) -> Response:
        """``answer`` under the same admission control, from a thread other than the event
        loop's (the gRPC server's): hops onto the loop, blocks until the response (or the 504
        after ``request_timeout_s``). The request's allowance is released once it is answered."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return self.refuse(AgentStoppingError("the agent is stopping"))
        answered: Future[Response] = Future()

        def respond(response: Response) -> None:
            # On the loop thread; a 504 may come first, the worker's answer then finds it done.
            if answered.done():
                return
            if request.allowance is not None:
                request.allowance.release()
            answered.set_result(response)

        def submit() -> None:
            try:
                self._infer(request, respond, answer, target)
            except RuntimeError:  # the pool was shut down: the agent is stopping
                respond(self.refuse(AgentStoppingError("the agent is stopping")))

        try:
            loop.call_soon_threadsafe(submit)
        except RuntimeError:  # the loop closed meanwhile
            return self.refuse(AgentStoppingError("the agent is stopping"))
        try:
            # The loop answers within request_timeout_s (its 504); the margin covers a stopping loop.
            return answered.result(timeout=self.config.request_timeout_s + 5)
        except FutureTimeoutError:
            return self.refuse(AgentStoppingError("the agent is stopping"))

    def _too_late(self, respond: Respond) -> None:
        respond(self.refuse(AnswerTimeoutError(f"no answer within {self.config.request_timeout_s:g} s")))

    def _finish(self, future: Future[Response], respond: Respond, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self.requests.count -= 1
        try:
            response = future.result()
        except Exception as exc:  # noqa: BLE001 - _work turns every expected error into a response
            response = self.refuse(exc, "the inference pool")
        respond(response)
        if response.served is not None:
            self.server.tap(*response.served)
        if self.requests.count == 0 and self._drained is not None:
            self._drained.set()

    def _work(self, request: Request, answer: InferAnswer, target: Any, enqueued: float) -> Response:
        if time.monotonic() - enqueued > self.config.request_timeout_s:
            return self.refuse(QueueExpiredError("request expired in the queue"))
        started = time.perf_counter()
        response = self._answer(request, answer, target)
        self.took(time.perf_counter() - started)
        return response

    def took(self, took: float) -> None:
        """Fold one answer's duration into the inline decision: a tiny model is answered on the
        loop while one of the last eight answers took under ``inline_max_s``. ``inline_left``
        counts down the slow answers since the last fast one (the shortest of the last eight
        is under the threshold while it is above 0), so a fast answer, nearly every one, is
        one comparison and one store.

        Why the shortest: these are wall-clock times (what blocks the loop, a wait on an
        accelerator included), and on a loaded machine a tiny model's run is often preempted
        for milliseconds; an average (as before) then sent its requests through the pool, two
        thread hops each, at 1.5-2x the CPU per answer at load 9-10. A model that is really
        slow (another one swapped in, a device to wait for) is slow every time: two runs in a
        row over ten times the threshold send the next ones to the pool, until a fast run there
        says otherwise. Not one alone: on a loaded 2-core machine a 40 µs run is preempted
        for milliseconds every few hundred requests, and each such run sent the next ones
        through the pool (in process, one client, load ~8: 137 of 5,000 requests through the
        pool with one slow run enough, 41 with two in a row). (A race between pool threads
        only blurs this; it decides a fast path.)"""
        if took < self.inline_max_s:
            self.inline_left = _INLINE_RUNS
            return
        very_slow = took > self._slow_s
        # The answer before was slow too when the count is down (a fast one refills it), and
        # _slow_last says whether it was far over: two in a row, the pool from now on.
        if very_slow and self._slow_last and self.inline_left < _INLINE_RUNS:
            self.inline_left = 0
        elif self.inline_left:
            self.inline_left -= 1
        self._slow_last = very_slow

    def _answer(self, request: Request, answer: InferAnswer, target: Any) -> Response:
        """``answer``'s response, or the error it raised as its class says (same for v1, v2, gRPC)."""
        try:
            return answer(self.server, request, target)
        except Exception as exc:  # noqa: BLE001 - a bug in one request is a 500, never a dead agent
            return self.refuse(exc, request.path)

    def refuse(self, exc: BaseException, where: str = "") -> Response:
        """``exc`` answered and counted as its class says (agent/api/refusal.py)."""
        refusal = refusal_of(exc, where)
        if refusal.error_kind is not None:
            self.metrics.count_error(refusal.error_kind)
        retry = [("Retry-After", str(refusal.retry_after))] if refusal.retry_after is not None else None
        response = json_response(refusal.http_status, {"error": refusal.message}, retry)
        response.refusal = refusal
        return response

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no request is running or queued (SIGTERM); False on timeout."""
        if self.requests.count == 0:
            return True
        self._drained = asyncio.Event()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


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
_V2_MODEL_GETS: dict[str, Callable[[ModelServer, open_inference.ModelRoute], Response]] = {
    "metadata": open_inference.model_metadata_response,
    "ready": open_inference.model_ready,
}
