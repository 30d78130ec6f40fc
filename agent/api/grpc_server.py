"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``.

Off unless ``api.grpc.enabled``; needs the ``grpc`` extra (grpcio, protobuf), imported only
then, so a device without it never loads grpc. RPCs: ServerLive, ServerReady, ServerMetadata,
ModelReady, ModelMetadata, ModelInfer. Any other (ModelStreamInfer, ModelStatistics, ...):
UNIMPLEMENTED, counted as ``not_found`` as the HTTP API counts a route it does not have.

It is a second front door to the same house: every ModelInfer goes through the ``Scheduler``'s
admission control (``max_concurrency`` + ``max_queue``, the inline fast path, the pool, the
``request_timeout_s`` deadline) and the same ``ModelServer`` path as ``/v1`` and ``/v2`` over
HTTP; tensors are decoded by the same functions as ``/v2`` (``grpc_codec``). The limits are
the HTTP API's:

=====================================================  ======================================
a message over ``api.max_body_bytes``                  RESOURCE_EXHAUSTED (grpc refuses it
                                                       before the handler runs)
a message that does not fit the memory budget for      UNAVAILABLE (retry shortly; HTTP: 503)
requests in flight (``max_inflight_bytes``, shared
with HTTP; a message is charged twice: its bytes and
its parsed form are both held)
arrays over ``max_decoded_bytes``                      RESOURCE_EXHAUSTED (HTTP: 413)
at capacity (running + queued), no model loaded        UNAVAILABLE (HTTP: 503)
more RPCs at once than capacity + 8                    RESOURCE_EXHAUSTED (grpc itself)
malformed message, wrong datatype/shape, NaN/Inf,      INVALID_ARGUMENT with the message
unknown input or output                                HTTP gives (HTTP: 400/422)
unknown model or version                               NOT_FOUND (ModelReady: ready=false)
an RPC not served here (ModelStreamInfer, ...)         UNIMPLEMENTED (HTTP: 404 no route)
no answer within ``request_timeout_s``                 DEADLINE_EXCEEDED (HTTP: 504)
the runtime failed, a bug                              INTERNAL (HTTP: 500)
=====================================================  ======================================

Handlers run in grpc's thread pool and block on the event loop's answer; the pool has one
thread per request admission control can hold, created as they are needed.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
from edgesdk.agent.api import grpc_codec
from edgesdk.agent.api import open_inference_v2_pb2 as pb
from edgesdk.agent.api.answer import Answer
from edgesdk.agent.api.budget import Allowance, BudgetRefused, InflightBytesBudget
from edgesdk.agent.api.codec import DecodeError
from edgesdk.agent.api.open_inference import ModelRoute, served_model
from edgesdk.agent.api.refusal import ErrorAnswer
from edgesdk.agent.api.scheduler import Scheduler
from edgesdk.agent.serving import ModelNotFoundError, NoModelError
from google.protobuf.message import DecodeError as ProtobufDecodeError

from edgesdk.errors import AgentError

log = logging.getLogger("edgesdk.agent.api")

#: The service name clients call (``/inference.GRPCInferenceService/ModelInfer``).
SERVICE = "inference.GRPCInferenceService"
#: The RPCs served (``GrpcInferenceService.handlers``); any other is UNIMPLEMENTED.
SERVED = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelInfer")
#: RPCs beyond what admission control can hold (health and metadata calls while it is full).
_EXTRA_RPCS = 8


def _abort(context: grpc.ServicerContext, refusal: ErrorAnswer) -> NoReturn:
    """End the RPC with the error's own gRPC code and message (agent/api/refusal.py)."""
    context.abort(getattr(grpc.StatusCode, refusal.grpc_status), refusal.message)
    raise AssertionError("grpc's abort returned")  # it raises; this tells the type checker


class GrpcInferenceService:
    """The RPC handlers (plain methods: ``handlers`` wires them to grpc)."""

    def __init__(self, scheduler: Scheduler, budget: InflightBytesBudget, max_decoded_bytes: int) -> None:
        self.scheduler = scheduler
        self.server = scheduler.server
        self.metrics = scheduler.metrics
        self.budget = budget
        self.max_decoded_bytes = max_decoded_bytes

    def server_live(self, request: pb.ServerLiveRequest, context: grpc.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, request: pb.ServerReadyRequest, context: grpc.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server.running_model() is not None)

    def server_metadata(
        self, request: pb.ServerMetadataRequest, context: grpc.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return grpc_codec.server_metadata_message()

    def model_ready(self, request: pb.ModelReadyRequest, context: grpc.ServicerContext) -> pb.ModelReadyResponse:
        # A boolean question: an unknown model or version is "not ready" (clients' is_model_ready).
        try:
            served_model(self.server, ModelRoute("ready", request.name, request.version or None))
        except (ModelNotFoundError, NoModelError):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    def model_metadata(
        self, request: pb.ModelMetadataRequest, context: grpc.ServicerContext
    ) -> pb.ModelMetadataResponse:
        try:
            model = served_model(self.server, ModelRoute("metadata", request.name, request.version or None))
        except (ModelNotFoundError, NoModelError) as exc:
            self._refuse(context, exc)
        return grpc_codec.model_metadata_message(model)

    def _refuse(self, context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
        """``exc`` counted and answered as its class says (agent/api/refusal.py)."""
        _abort(context, self.scheduler.refuse(exc, "gRPC"))

    def model_infer(self, message_bytes: bytes, context: grpc.ServicerContext) -> bytes:
        allowance = Allowance(self.budget, self.max_decoded_bytes)
        # The serialized message and the parsed one are both held until the answer.
        if not allowance.take_body(2 * len(message_bytes)):
            self._refuse(
                context,
                BudgetRefused(
                    503,
                    f"a message of {len(message_bytes)} bytes does not fit the agent's memory budget for requests "
                    f"in flight ({self.budget.capacity} bytes, api.max_inflight_bytes) now; retry shortly",
                ),
            )
        try:
            try:
                message = pb.ModelInferRequest.FromString(message_bytes)
            except ProtobufDecodeError as exc:
                self._refuse(context, DecodeError(f"not a ModelInferRequest message: {exc}"))
            work = functools.partial(grpc_codec.answer_grpc_infer, self.server, message, allowance)
            outcome = self.scheduler.submit_from_thread(
                work, size=len(message_bytes), where=f"gRPC ModelInfer {message.model_name}"
            )
        finally:
            allowance.release()
        if type(outcome) is not Answer:  # counted by the scheduler already
            _abort(context, outcome)
        return outcome.body

    def handlers(self) -> grpc.GenericRpcHandler:
        def unary(method: Any, request_type: Any, response_type: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                method,
                request_deserializer=request_type.FromString if request_type is not None else None,
                response_serializer=response_type.SerializeToString if response_type is not None else None,
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ServerLive": unary(self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
                "ServerReady": unary(self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
                "ServerMetadata": unary(self.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
                "ModelReady": unary(self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
                "ModelMetadata": unary(self.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
                # Bytes in and out: the size is charged before parsing; the answer is serialized
                # in the inference pool, as the HTTP routes encode there.
                "ModelInfer": unary(self.model_infer, None, None),
            },
        )


class _UnservedMethods(grpc.GenericRpcHandler):
    """Asked last, for an RPC no other handler serves: UNIMPLEMENTED (as grpc itself answers),
    counted as ``not_found``, as ``ApiApp`` counts a route it does not have."""

    def __init__(self, count_error: Callable[[str], None]) -> None:
        self.count_error = count_error

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method

        def refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            # Streaming both ways takes a call of any kind; no message of it is read.
            self.count_error("not_found")
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served here; served: {SERVED}")
            yield b""  # never reached (abort raises): a generator, as the handler kind requires

        return grpc.stream_stream_rpc_method_handler(refuse)


class GrpcServer:
    """The listening gRPC server around :class:`GrpcInferenceService`."""

    def __init__(
        self, scheduler: Scheduler, budget: InflightBytesBudget, *, max_message_bytes: int, max_decoded_bytes: int
    ) -> None:
        # The HTTP API's scheduler and memory budget: the same admission control for both
        # transports, and nothing of HTTP's types here.
        self.service = GrpcInferenceService(scheduler, budget, max_decoded_bytes)
        capacity = scheduler.capacity + _EXTRA_RPCS
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=capacity, thread_name_prefix="grpc"),
            handlers=[self.service.handlers(), _UnservedMethods(scheduler.metrics.count_error)],
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                # Two agents must never share a port silently.
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=capacity,
        )

    def start(self, host: str, port: int) -> int:
        """Listen (plaintext, like the HTTP API: loopback unless configured otherwise); the bound port."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise AgentError(f"cannot listen for gRPC on {address}: {exc}") from exc
        if not bound:  # older grpcio returns 0 instead of raising
            raise AgentError(f"cannot listen for gRPC on {address}")
        self._server.start()
        return int(bound)

    def stop(self, grace_s: float) -> threading.Event:
        """Refuse new RPCs, let running ones finish for ``grace_s``; set when all are done."""
        return self._server.stop(grace_s)
