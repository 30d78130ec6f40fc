"""Every error edgesdk raises on purpose.

    EdgeSDKError
    ├── UsageError                 bad argument or option given by a person or a script
    │   ├── FieldError             (edgesdk/fleet/service/rollout_form.py) a dashboard form field holds a bad value
    │   ├── TargetError            (edgesdk/fleet/service/targeting.py) a device filter that does not parse, or is not saved
    │   └── BadQuery               (edgesdk/fleet/service/dashboard_devices.py) a devices page query parameter it cannot use
    ├── ProfileError               a device profile is unknown, unreadable or invalid
    ├── SchemaError                a document does not match its schema (manifest, config, payload)
    ├── ModelError                 a model cannot be read, or has an input/output we cannot handle
    ├── ConversionError            a converter or quantizer failed
    │   ├── UnsupportedOpError     the target format cannot express an op of the model
    │   └── AccuracyGateError      no variant kept the accuracy the gate asks for
    ├── BudgetError                nothing fits the profile's size or memory budget
    ├── KeyFileError               a key file is missing, malformed or has loose permissions
    ├── CaptureFileError           (edgesdk/capture/sealed.py) a capture file is not one, was changed, or is for another key
    ├── TrustError                 a trust document is malformed, badly signed, or cannot replace the current one
    │   ├── TrustRollbackError     its version is not newer than the trusted one (rollback or replay)
    │   └── TrustExpiredError      the trusted document has expired: no new content until a newer one
    ├── BundleError                a bundle is malformed or cannot be trusted
    │   ├── BundleFormatError      container structure is broken (truncated, bad offsets, absurd sizes)
    │   ├── SignatureError         manifest signature missing, invalid, or by an unknown publisher
    │   ├── IntegrityError         a payload hash does not match the manifest
    │   ├── ExpiredBundleError     the bundle's expiry is in the past
    │   ├── RollbackError          release counter not newer than the installed one
    │   │   └── RollbackFloorUnknownError  no surviving record says the floor: installs refused
    │   ├── TargetMismatchError    the bundle is not meant for this device's profile
    │   └── DecryptionError        no key slot opens with this device key
    ├── RuntimeBackendError        a runtime (onnxruntime, LiteRT, OpenVINO, Core ML) failed
    │   └── BackendUnavailableError   the runtime is not installed on this machine
    ├── AgentError                 the device agent cannot do what was asked
    │   ├── ConfigError            the agent configuration is invalid
    │   ├── InferenceInputError    a request does not match the model's input signature
    │   │   ├── DeclaredInputError     (agent/api/codec.py) what an encoding declares does not fit, found before allocating
    │   │   └── DecodedValueError      (agent/api/codec.py) a value its input's dtype cannot hold, found while decoding
    │   ├── ModelNotFoundError     (agent/serving.py) the request names a model not served here
    │   ├── NoModelError           (agent/serving.py) no model is loaded yet
    │   ├── ModelRamBudgetError    (agent/memory_budget.py) an install would not fit in the model memory budget
    │   ├── BatchAbandonedError    (agent/batching.py) a request's batch ended without running
    │   ├── SecurityStateError     (agent/security_state.py) the device's security record is missing or invalid: tampered
    │   ├── DecodeError            (agent/api/codec.py) a body is not valid in its encoding
    │   ├── UnsupportedEncodingError  (agent/api/codec.py) an encoding the API does not speak
    │   ├── BudgetRefused          (agent/api/budget.py) a request over its size cap (413) or the memory budget (503)
    │   ├── AtCapacityError        (agent/api/refusal.py) the API's running and waiting requests are at their limit (503)
    │   ├── AgentStoppingError     (agent/api/refusal.py) the agent is stopping: no new requests (503)
    │   ├── AnswerTimeoutError     (agent/api/refusal.py) no answer within request_timeout_s (504)
    │   │   └── QueueExpiredError  (agent/api/refusal.py) a request that waited in the queue past it
    │   ├── _BadRequest            (agent/api/http.py) bad HTTP framing; never leaves that module
    │   └── AgentRequestError      the agent's local API answered an error, or could not be reached
    │       ├── AgentInputError        400/413/422: the request's tensors or body were refused
    │       ├── AgentNotFoundError     404: no such model (or route)
    │       ├── AgentUnavailableError  503: overloaded (retry after ``retry_after``) or no model loaded
    │       ├── AgentTimeoutError      504, or no answer within the client's timeout
    │       └── AgentConnectionError   the socket could not be opened or broke before an answer
    │           └── _Stale             (edgesdk/client/async_client.py) a kept-alive connection the agent closed; retried
    ├── PipelineInputError         (edgesdk/pipeline/errors.py) raw input the bundle's pipeline refuses (its HTTP status)
    ├── LinkError                  the MQTT link failed (connect, TLS, publish)
    ├── UpdateError                an over-the-air update failed or was refused
    │   ├── SmokeTestError         (agent/ota/smoke.py) a new variant failed its smoke test
    │   ├── UpdateCancelled        (agent/ota/machine.py) the operator cancelled the deployment
    │   ├── ProbationFailed        (agent/ota/machine.py) the new model breached a health criterion
    │   ├── CommandRefused         (agent/ota/freshness.py) a signed command is replayed, expired, not yet valid or not for this device
    │   ├── SourcesFailed          (agent/ota/http_fetch.py) every artifact URL of a deployment failed
    │   └── ConnectionCut          (agent/ota/http_fetch.py) an artifact server unreachable or cut mid-body; tried again
    ├── ImageError                 a provisioning image cannot be built (recipe, wheelhouse)
    ├── EnrollmentError            a device cannot be enrolled, approved or revoked
    ├── FleetServiceError          the fleet service's database cannot be opened, migrated or written
    └── DemoError                  (edgesdk/demo/story.py) a demo step could not finish

Classes drawn with a module live next to the one part that raises them; the rest live here.
``tests/unit/test_error_tree.py`` fails when an exception class defined anywhere in the
project is outside this tree or missing from this drawing.

Messages name the bad value and, where there is one, what to do instead. Errors from
libraries below us are translated at our boundary with ``raise X(...) from exc`` so the
cause stays attached for debugging while users see one clear line. The kind of an error is
its type: code never tells errors apart by matching their message text. Where a library's
message is its only signal (a converter that defines no exception types, a tool run as a
subprocess), the matching stays in the one adapter that talks to it, which names the type.

Built-in exceptions remain only where Python's protocols ask for them and never cross a
public boundary untranslated: ``ValueError`` inside pydantic validators (pydantic turns it
into a ``ValidationError`` that the loaders translate), ``AttributeError`` from a module's
``__getattr__``, ``TypeError`` for a misused type (``VerifiedBundle``), ``KeyError`` from a
lookup its callers translate, ``EOFError`` inside the unseal pipe's framing.
"""

from __future__ import annotations


class EdgeSDKError(Exception):
    """Root of every error edgesdk raises on purpose."""


class UsageError(EdgeSDKError):
    """A bad argument or option from the command line or an API caller."""


class ProfileError(EdgeSDKError):
    """A device profile is unknown, unreadable or invalid."""


class SchemaError(EdgeSDKError):
    """A document does not match its schema."""


class ModelError(EdgeSDKError):
    """A model cannot be read or has an input/output edgesdk cannot handle."""


class ConversionError(EdgeSDKError):
    """A converter or quantizer failed."""


class UnsupportedOpError(ConversionError):
    """The target format cannot express an op of the model."""


class AccuracyGateError(ConversionError):
    """No variant kept the accuracy its gate asks for."""


class BudgetError(EdgeSDKError):
    """Nothing fits the device profile's size or memory budget."""


class KeyFileError(EdgeSDKError):
    """A key file is missing, malformed or has loose permissions."""


class TrustError(EdgeSDKError):
    """A trust document is malformed, not signed by the root keys it needs, or cannot replace
    the trusted one."""


class TrustRollbackError(TrustError):
    """A trust document's version is not newer than the trusted one (a rollback or a replay)."""


class TrustExpiredError(TrustError):
    """The trusted document has expired: new content is refused until a newer document arrives."""


class BundleError(EdgeSDKError):
    """A bundle is malformed or cannot be trusted."""


class BundleFormatError(BundleError):
    """The bundle container is structurally broken."""


class SignatureError(BundleError):
    """The manifest signature is missing, invalid or from an unknown publisher."""


class IntegrityError(BundleError):
    """A payload does not match the hash in the manifest."""


class ExpiredBundleError(BundleError):
    """The bundle expired."""


class RollbackError(BundleError):
    """The bundle's release counter is not newer than the installed one."""


class RollbackFloorUnknownError(RollbackError):
    """The device has installed before, but no record survives to say its rollback floor:
    installs are refused rather than treated as a fresh device."""


class TargetMismatchError(BundleError):
    """The bundle is not built for this device's profile."""


class DecryptionError(BundleError):
    """No key slot of the bundle opens with this device key."""


class RuntimeBackendError(EdgeSDKError):
    """An inference runtime failed."""

    # How the agent's API answers it (agent/api/refusal.py): its message, as a 500.
    http_status = 500
    grpc_status = "INTERNAL"
    error_kind: str | None = None  # counted as "runtime" where it was raised (agent/serving.py)
    retry_after: float | None = None
    public = True


class BackendUnavailableError(RuntimeBackendError):
    """The inference runtime is not installed on this machine."""


class AgentError(EdgeSDKError):
    """The device agent cannot do what was asked."""

    # How the agent's API answers one that reaches a client (agent/api/refusal.py): the HTTP
    # status, the gRPC status code's name, the kind the error counter counts it as (None:
    # counted where it was raised), Retry-After seconds, and whether its message is shown.
    # Subclasses that reach clients set their own; this default is an unexpected failure: a
    # 500/INTERNAL that names only its type.
    http_status = 500
    grpc_status = "INTERNAL"
    error_kind: str | None = "internal"
    retry_after: float | None = None
    public = False


class ConfigError(AgentError):
    """The agent configuration is invalid."""


class InferenceInputError(AgentError):
    """An inference request does not match the model's input signature."""

    http_status = 422
    grpc_status = "INVALID_ARGUMENT"
    error_kind: str | None = None  # the server counts bad_input where it checks (agent/serving.py)
    public = True


class LinkError(EdgeSDKError):
    """The MQTT link failed."""


class UpdateError(EdgeSDKError):
    """An over-the-air update failed or was refused."""


class ImageError(EdgeSDKError):
    """A provisioning image cannot be built (no recipe, Python too old, wheels missing)."""


class EnrollmentError(EdgeSDKError):
    """A device cannot be enrolled, approved or revoked (unknown device, bad key, registry)."""


class FleetServiceError(EdgeSDKError):
    """The fleet service's database cannot be opened, migrated or written (``edgesdk fleet serve``)."""


class AgentRequestError(AgentError):
    """The agent's local API answered with an error status, or could not be asked at all.

    ``status`` is the HTTP status (None when no answer came), ``detail`` the agent's own
    error text, ``url`` what was asked. Raised by :class:`edgesdk.AgentClient`."""

    def __init__(self, message: str, *, status: int | None = None, detail: str = "", url: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.url = url


class AgentInputError(AgentRequestError, InferenceInputError):
    """The agent refused the request's tensors or body (HTTP 400, 413 or 422)."""


class AgentNotFoundError(AgentRequestError):
    """The agent serves no model (or route) by that name (HTTP 404)."""


class AgentUnavailableError(AgentRequestError):
    """The agent is at capacity or has no model loaded (HTTP 503); ``retry_after`` in seconds."""

    def __init__(
        self, message: str, *, status: int | None = None, detail: str = "", url: str = "", retry_after: float | None
    ) -> None:
        super().__init__(message, status=status, detail=detail, url=url)
        self.retry_after = retry_after


class AgentTimeoutError(AgentRequestError):
    """No answer in time: the agent's own deadline (HTTP 504) or the client's timeout."""


class AgentConnectionError(AgentRequestError):
    """The agent could not be reached, or the connection broke before a whole answer came."""
