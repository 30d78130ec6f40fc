"""AgentConfig: the device agent's configuration (``/etc/edgesdk/agent.toml``).

Environment variables override file values: ``EDGESDK_AGENT__API__PORT=9000`` sets
``api.port`` (double underscore separates levels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.messages import MAX_COMMAND_VALIDITY_S


class BatchingSettings(Schema):
    """Dynamic batching of one model (Triton's semantics; agent/batching.py). It applies only
    when every input and output of the served model has a dynamic first (batch) axis; a model
    without one is always served one request at a time, whatever this says."""

    enabled: bool = Field(
        False,
        description="coalesce concurrent requests of the same shape into one run (BENCHMARKS.md, 'Dynamic "
        "batching': on the 2-core reference machine it was no throughput win for MobileNetV2, so off by default)",
    )
    max_batch_size: int = Field(8, ge=1, le=1024, description="rows (summed batch axes) in one run at most")
    max_queue_delay_us: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="how long the oldest request of a batch waits for more to join; 0: requests join only "
        "while the runs in progress keep the batch from starting",
    )
    max_concurrent_batches: int = Field(
        4,
        ge=1,
        le=64,
        description="batches running at once (Triton's instance count; as many as max_concurrency's default); "
        "more wait, and fill. On 2 cores MobileNetV2 at c=16 ran at ~0.3x the unbatched throughput with 1, "
        "0.6-0.8x with 2, 0.8-1.4x with 4 (BENCHMARKS.md)",
    )


class BatchingConfig(BatchingSettings):
    """``[api.batching]``: the settings for every model, and ``[api.batching.models.NAME]`` for one."""

    models: dict[str, BatchingSettings] = Field(
        default_factory=dict, description="per model name: settings replacing the ones above for that model"
    )

    def for_model(self, name: str) -> BatchingSettings:
        """The settings that apply to model ``name``."""
        return self.models.get(name) or BatchingSettings(
            enabled=self.enabled,
            max_batch_size=self.max_batch_size,
            max_queue_delay_us=self.max_queue_delay_us,
            max_concurrent_batches=self.max_concurrent_batches,
        )

    def pool_threads(self, max_concurrency: int) -> int:
        """Threads the API needs so that batches can fill: a request waiting in a batch holds a
        thread while it waits, so the running batches and one filling batch each need
        ``max_batch_size`` threads; never fewer than ``max_concurrency``."""
        settings = [self, *self.models.values()]
        wanted = [(s.max_concurrent_batches + 1) * s.max_batch_size for s in settings if s.enabled]
        return max([max_concurrency, *wanted])


class GrpcConfig(Schema):
    """``[api.grpc]``: the Open Inference Protocol over gRPC (KServe v2, what ``tritonclient.grpc``
    speaks) beside the HTTP API, with its limits (docs/agent.md). Needs the ``grpc`` extra."""

    enabled: bool = Field(False, description="serve inference.GRPCInferenceService (pip install 'edgesdk[grpc]')")
    host: str = Field("127.0.0.1", description="bind address (plaintext, as the HTTP API); loopback unless you mean it")
    port: int = Field(8471, ge=0, le=65535, description="0 picks a free port (written to the data dir as grpc.port)")


class ApiConfig(Schema):
    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean to expose it")
    port: int = Field(8470, ge=0, le=65535, description="0 picks a free port (written to the data dir)")
    unix_socket: Path | None = Field(None, description="also serve on this Unix socket (mode 0660)")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    max_inflight_bytes: int | None = Field(
        None,
        gt=0,
        description="memory for requests in flight, all connections together: bodies being read or waiting plus "
        "the arrays decoded from them; a body that does not fit gets 503 + Retry-After before it is read. "
        "None: 8 x max_body_bytes (16 clients posting 3 MB JSON tensors to a 4-worker agent need ~75 MB: "
        "bodies waiting plus four being parsed)",
    )
    max_decoded_bytes: int | None = Field(
        None,
        gt=0,
        description="arrays one request may decode to, checked against what the encoding declares before "
        "anything is allocated (413 over it). None: max_body_bytes",
    )
    max_concurrency: int = Field(4, gt=0, description="inferences running at once")
    max_queue: int = Field(64, ge=0, description="requests waiting beyond that; more get 503")
    request_timeout_s: float = Field(30.0, gt=0)
    header_timeout_s: float = Field(10.0, gt=0, description="slow clients are cut off after this")
    allow_nonfinite: bool = Field(False, description="accept NaN/Inf in float inputs")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body must arrive within this")
    keepalive_timeout_s: float = Field(15.0, gt=0, description="idle keep-alive connections close after this")
    max_connections: int = Field(
        256,
        gt=0,
        description="open connections at once; past it a new one closes the oldest connection inside an unfinished "
        "header block, else the one idle the longest, and is refused with 503 only when every connection is reading a "
        "body or being answered",
    )
    max_connections_per_client: int = Field(
        64,
        gt=0,
        description="open connections from one address, beyond which they are refused with 503; loopback and the "
        "Unix socket are not counted (every local client shares one address there)",
    )
    min_rate_bytes_s: int = Field(
        1024,
        ge=0,
        description="a header block and a body must each arrive at least this fast on average, counted from their "
        "first byte after min_rate_grace_s, or the client is cut off with 408 (slowloris, slow bodies); 0: no minimum "
        "(header_timeout_s and body_timeout_s still apply)",
    )
    min_rate_grace_s: float = Field(
        2.0, gt=0, description="how long a header block or body may take before min_rate_bytes_s applies"
    )
    inline_max_ms: float = Field(
        0.5,
        ge=0,
        description="when recent requests took less than this (the shortest of the last eight), answer on the "
        "event loop without the thread-pool hop (tiny models; with dynamic batching only when no other request "
        "is in flight); 0 disables",
    )
    inline_batch_max: int = Field(
        16,
        ge=1,
        le=64,
        description="tiny models answered on the event loop (inline_max_ms) with a batch axis: requests of one "
        "shape that arrive in one wake-up of the loop, from several connections, run as one batch of up to this "
        "many rows in the model's batch former, the one [api.batching] uses (no waiting for company); 1 runs each alone",
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig)  # type: ignore[arg-type]
    grpc: GrpcConfig = Field(default_factory=GrpcConfig)  # type: ignore[arg-type]


class TlsConfig(Schema):
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False


class MqttConfig(Schema):
    enabled: bool = False
    broker: str = Field("mqtt://127.0.0.1:1883", description="mqtt://host:port or mqtts://host:port")
    namespace: str = Field("edgesdk", pattern=r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")
    groups: list[str] = Field(default_factory=list)
    username: str | None = None
    password_file: Path | None = None
    tls: TlsConfig | None = None
    telemetry_interval_s: float = Field(5.0, gt=0)
    queue_max_mb: float = Field(64.0, gt=0, description="disk quota of the store-and-forward queue")
    keepalive_s: int = Field(30, gt=0)
    protocol: Literal["auto", "5", "3.1.1"] = Field("auto", description="MQTT 5 first, 3.1.1 when refused")
    max_inbound_bytes: int = Field(
        1024 * 1024, gt=0, description="larger messages on the device's topics are ignored and counted"
    )
    events_per_minute: int = Field(120, gt=0, description="events beyond this rate are summarized, not queued")


class GovernorConfig(Schema):
    enabled: bool = True
    source: Literal["auto", "sysfs", "psutil", "vcgencmd", "jetson", "trace"] = "auto"
    trace_file: Path | None = Field(None, description="scripted sensor trace for tests and demos")
    poll_interval_s: float = Field(1.0, gt=0)
    min_dwell_s: float | None = Field(None, ge=0, description="override the profile's min dwell time")


class OtaConfig(Schema):
    """Over-the-air updates on this device: bounds on a download (so a slow or stalled source
    ends in FAILED, not forever) and the clock tolerance of the command freshness checks."""

    download_min_rate_bytes_s: float = Field(
        1024.0,
        gt=0,
        description="slower than this, averaged over download_rate_window_s (MQTT: at least two chunks' "
        "worth at this rate), fails the download",
    )
    download_rate_window_s: float = Field(60.0, gt=0, description="the sliding window of the minimum rate")
    download_deadline_min_s: float = Field(
        300.0, gt=0, description="overall deadline of a download: its size at the minimum rate, at least this"
    )
    download_deadline_max_s: float = Field(6 * 3600.0, gt=0, description="... and at most this")
    http_ca_file: Path | None = Field(
        None,
        description="CA certificates that artifact servers' TLS is checked against (the fleet CA); default the "
        "MQTT link's tls.ca_file, else the system's trust store",
    )
    http_redirect_hosts: list[str] = Field(
        default_factory=list,
        description="hosts an artifact URL may redirect to besides its own (a CDN's edge); others are refused",
    )
    clock_skew_s: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="tolerance between the fleet's clock and this device's when checking a command's "
        "issued_at/expires_at (docs/ota.md); raise it only for devices without a reliable clock",
    )
    max_command_validity_s: float = Field(
        MAX_COMMAND_VALIDITY_S,
        gt=0,
        le=30 * 24 * 3600,
        description="the longest a signed command may be valid (expires_at - issued_at); a longer one is "
        'refused, so a captured command is never usable for years (docs/ota.md, "Fresh, bound commands")',
    )


class ModelPolicy(Schema):
    """``[models.NAME]``: how the agent runs one installed model (docs/agent.md, "Several models")."""

    precision: Literal["fp32", "fp16", "int8"] | None = Field(
        None,
        description="pin this model to the variant of this precision (its governor then never switches it); "
        "None: the governor moves it along its ladder",
    )


class ProfilingConfig(Schema):
    """On-device profiling once a model is proven (docs/devices.md): after an update commits (the
    end of probation) or a committed model this device never measured is loaded, a low-priority
    child process times every variant and the governor's ladder follows what it measured."""

    on_install: bool = Field(True, description="profile each newly committed model in the background")
    warmup: int = Field(5, ge=0, description="untimed runs per variant first")
    runs: int = Field(50, ge=1, description="timed runs per variant")
    nice: int = Field(10, ge=0, le=19, description="the profiling child's niceness: serving keeps the CPU first")
    timeout_s: float = Field(1800.0, gt=0, description="a profiling run that takes longer is stopped and reported")


class CaptureConfig(Schema):
    """``[capture]``: sampled data capture (docs/agent.md, "Data capture"), off by default. A share of
    answered requests (inputs, outputs, model, release, variant, time) is written under
    ``data_dir/capture``, each file encrypted to the operator's X25519 public key: the device
    cannot read what it captured, and nor can anyone who takes its disk."""

    rate: float = Field(0.0, ge=0, le=1, description="share of answered requests captured; 0: capture off")
    operator_public_key: Path | None = Field(
        None,
        description="the operator's X25519 public key file (edgesdk capture keygen); capture refuses to start "
        "without it",
    )
    max_mb: float = Field(100.0, gt=0, description="disk budget of the capture files; the oldest go first")
    retention_days: float = Field(30.0, gt=0, description="capture files older than this are deleted")
    redact: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description="'module:function' called with (feeds, outputs) before a record is written; it returns the "
        "(feeds, outputs) that may be kept, or None to keep nothing. A hook that raises keeps nothing",
    )
    upload: bool = Field(
        False,
        description="send finished capture files to the fleet service over MQTT (needs [mqtt] enabled); off: "
        "capture works offline and the files stay on the device",
    )


class AgentConfig(Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    profile: str
    data_dir: Path = Path("/var/lib/edgesdk")
    device_key: Path | None = Field(None, description="X25519 private key; created in data_dir if missing")
    publisher_keys: list[Path] = Field(
        default_factory=list,
        description="trusted Ed25519 public keys, for bundles AND deployments (roles not separated); "
        "ignored when trust_document is set",
    )
    trust_document: Path | None = Field(
        None,
        description="root-signed trust document (edgesdk trust sign): its publisher keys verify bundles, its "
        "operator keys deployments; newer ones arrive over MQTT or edge-agent trust install (kept in data_dir)",
    )
    unseal: Literal["helper", "in_process"] = Field(
        "helper",
        description="where installed bundles are verified and decrypted: a short-lived helper process (the "
        "daemon then never loads the crypto library or the device key; ~10 MB less RSS) or the daemon itself "
        "(no process start: ~0.1-0.5 s sooner serving)",
    )
    api: ApiConfig = Field(default_factory=ApiConfig)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    governor: GovernorConfig = Field(default_factory=GovernorConfig)
    ota: OtaConfig = Field(default_factory=OtaConfig)
    profiling: ProfilingConfig = Field(default_factory=ProfilingConfig)
    capture: CaptureConfig = Field(default_factory=CaptureConfig)
    runtime_threads: int | None = Field(
        None,
        gt=0,
        description="threads per inference inside the runtime (onnxruntime intra-op); None: the runtime's default, "
        "or one thread for a model measured to run faster with one at load (a tiny model: the split costs more "
        "than it saves)",
    )
    runtime_spinning: bool = Field(
        False,
        description="let onnxruntime's intra-op threads busy-wait between runs (its own default); off by default: "
        "the spin takes the cores the API's event loop and its clients need (BENCHMARKS.md, issue 15)",
    )
    default_model: str | None = Field(
        None,
        description="the model the single-model routes and reports mean (/readyz, /v1/status's model, OTA "
        "deployments naming none); None: the first model installed (or the one a single-model data dir held)",
    )
    models: dict[str, ModelPolicy] = Field(default_factory=dict, description="per-model policies, by model name")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["journald", "json", "text"] = "journald"
