"""Serving the installed model: every gated variant loaded from memory, one of them active.

A bundle is swapped in whole: all of its variants are decrypted and loaded (in memory
only) BEFORE anything changes, then one reference assignment makes the new model the one
requests see. A request takes its variant reference once at the start, so requests in
flight finish on the variant they started on; a switched-out or swapped-out variant is
released when the last request holding it drops it (CPython reference counting), never
while it is running.

The governor moves between variants with :meth:`ModelServer.switch_variant`; the ladder is
the model's variants ordered by precision (fp32 first), one per precision, each the one
whose runtime the device profile prefers.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import numpy as np
from edgesdk.agent.batching import BatchFormer, has_batch_axis
from edgesdk.agent.events import EventBus
from edgesdk.agent.folded_inputs import check_folded_input
from edgesdk.agent.nonfinite import ScanThread, first_nonfinite, nonfinite_error, shared_scan_thread
from edgesdk.agent.tensor_signature import DEFERRED_SCAN_MIN_BYTES, Signature, dequantize, quantize
from edgesdk.agent.variant_choice import VariantChoice, VariantChoices

from edgesdk.errors import AgentError, EdgeSDKError, InferenceInputError, IntegrityError, RuntimeBackendError
from edgesdk.pipeline.audio import step_backends
from edgesdk.runtimes.base import LoadedModel
from edgesdk.runtimes.execution import ExecutionRequest
from edgesdk.schemas.agent_config import BatchingConfig
from edgesdk.schemas.common import PRECISION_LADDER, Precision
from edgesdk.schemas.manifest import TensorSpec, Variant
from edgesdk.schemas.measurements import DeviceMeasurements
from edgesdk.schemas.messages import RunningModel
from edgesdk.schemas.pipeline import Pipeline
from edgesdk.schemas.profile import DeviceProfile

log = logging.getLogger("edgesdk.agent.serving")

#: What ``ModelServer._run_counted`` hands a variant (feeds, or a stream's calls) and gets back.
_Request = TypeVar("_Request")
_Outputs = TypeVar("_Outputs")


class ModelNotFoundError(AgentError):
    """The request names a model this agent does not serve."""

    http_status, grpc_status, error_kind, public = 404, "NOT_FOUND", "not_found", True


class NoModelError(AgentError):
    """No model is loaded yet."""

    http_status, grpc_status, error_kind, public = 503, "UNAVAILABLE", "no_model", True
    retry_after = 5


class ServedVariant:
    """One loaded variant, with the adapters that make it look like the public signature."""

    def __init__(self, meta: Variant, loaded: LoadedModel) -> None:
        self.meta = meta
        self.id = meta.id
        self.precision = Precision(meta.precision)
        self.runtime = str(getattr(meta.runtime, "value", meta.runtime))
        self.sha256 = meta.sha256
        self.loaded = loaded
        self.inputs = self._merge_quantization(loaded.inputs, meta.inputs)
        self.outputs = self._merge_quantization(loaded.outputs, meta.outputs)
        # Non-thread-safe runtimes (a LiteRT interpreter) run one request at a time.
        self._lock: threading.Lock | None = None if loaded.thread_safe else threading.Lock()
        # Large float inputs are NaN/Inf-scanned on another core during the run when a run
        # leaves one idle, else before the run (see DEFERRED_SCAN_MIN_BYTES). A model from a
        # backend that does not say (an older plugin) is scanned before the run.
        self.scan_min_bytes: float = (
            DEFERRED_SCAN_MIN_BYTES if getattr(loaded, "cores_free_while_running", False) else math.inf
        )
        self._in_adapters = [(s.name, np.dtype(s.dtype), s) for s in self.inputs]
        self._out_specs = [s for s in self.outputs if s.quantization is not None]
        self._plain = all(s.quantization is None for s in self.inputs)
        # Set by ModelServer.serve once the public signature is known: True when checked feeds
        # can go to the runtime as they are (no quantization, same dtypes, no lock, no output
        # adapters), so the hot path skips the adapter loop (~10 µs with cold caches).
        self.takes_public_feeds = False

    def accepts_unadapted(self, signature: Signature) -> bool:
        """True when feeds that passed ``signature.check`` need no adapting for this variant."""
        dtypes = {name: dtype for name, dtype, _ in self._in_adapters}
        return (
            self._plain
            and self._lock is None
            and not self._out_specs
            and dtypes.keys() == signature.by_name.keys()
            and all(signature.by_name[name].dtype == dtype for name, dtype in dtypes.items())
        )

    @staticmethod
    def _merge_quantization(
        runtime_specs: Sequence[TensorSpec], manifest_specs: Sequence[TensorSpec]
    ) -> list[TensorSpec]:
        """The runtime's specs are the truth for names/dtypes; quantization may only be in the manifest."""
        by_name = {s.name: s for s in manifest_specs}
        merged = []
        for spec in runtime_specs or manifest_specs:
            declared = by_name.get(spec.name)
            if spec.quantization is None and declared is not None and declared.quantization is not None:
                spec = spec.model_copy(update={"quantization": declared.quantization})
            merged.append(spec)
        return merged

    def run_checked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``run`` for feeds that already passed the public signature's check."""
        if self.takes_public_feeds:
            return self.loaded.run(feeds)
        return self.run(feeds)

    def run(self, feeds: Mapping[str, np.ndarray], loaded: LoadedModel | None = None) -> dict[str, np.ndarray]:
        """Run with public-signature feeds; returns public-signature outputs. ``loaded``: a
        private copy of this variant's model to run on instead (``run_stream``)."""
        adapted: dict[str, np.ndarray] = {}
        for name, dtype, spec in self._in_adapters:
            array = feeds[name]
            if spec.quantization is not None and array.dtype.kind == "f":
                array = quantize(array, spec)
            elif array.dtype != dtype:
                array = array.astype(dtype)
            adapted[name] = array
        if loaded is not None:
            outputs = loaded.run(adapted)
        elif self._lock is None:
            outputs = self.loaded.run(adapted)
        else:
            with self._lock:
                outputs = self.loaded.run(adapted)
        for spec in self._out_specs:
            if spec.name in outputs:
                outputs[spec.name] = dequantize(outputs[spec.name], spec)
        return outputs

    def run_stream(self, calls: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """A streaming model over one request's ``calls``, from its initial state: on a fresh
        copy of the model where the runtime keeps the state inside it (LiteRT variables), so no
        other request sees or changes it; else the state, if any, is in the inputs."""
        fresh = getattr(self.loaded, "with_fresh_state", None)
        if fresh is None:
            return [self.run(call) for call in calls]
        loaded = fresh()
        try:
            return [self.run(call, loaded) for call in calls]
        finally:
            loaded.close()

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "precision": self.precision.value,
            "runtime": self.runtime,
            "format": str(getattr(self.meta.format, "value", self.meta.format)),
            "sha256": self.sha256,
            "accuracy": self.meta.accuracy.model_dump(mode="json") if self.meta.accuracy else None,
            # onnxruntime's intra-op threads and why (edgesdk/runtimes/ort_threads.py); None elsewhere
            "threads": getattr(self.loaded, "threads", None),
        }


@dataclass
class ServedModel:
    """A loaded model: its identity, its ladder of variants (best first), the active one."""

    name: str
    version: str
    release: int
    bundle_sha256: str | None
    ladder: list[ServedVariant]
    signature: Signature
    active: ServedVariant
    loaded_at: float = field(default_factory=time.time)
    #: Its batches (agent/batching.py) when it has a batch axis (ModelServer.serve): pool requests
    #: wait in them when ``[api.batching]`` is on for it, the event loop's inline ones join them.
    former: BatchFormer | None = None
    #: Every variant of the bundle: loaded, or why not (agent/variant_choice.py).
    choices: tuple[VariantChoice, ...] = ()
    #: The bundle's signed pre/post-processing (POST /v1/models/{name}/predict), if it has one.
    pipeline: Pipeline | None = None
    #: The API's inference plans for this model by body layout (agent/api/plan.py): made once,
    #: dropped with the model when another is swapped in.
    plans: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def run_active(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
        """Run checked feeds on the active variant, taken once; the former's ``run_batch``."""
        variant = self.active
        return variant.run_checked(feeds), variant.id

    def running(self, variant: ServedVariant | None = None) -> RunningModel:
        """This model with ``variant`` (the active one by default), as the agent reports what is serving."""
        variant = variant or self.active
        return RunningModel(
            name=self.name,
            version=self.version,
            release=self.release,
            variant=variant.id,
            sha256=variant.sha256,
            precision=variant.precision.value,
            runtime=variant.runtime,
            bundle_sha256=self.bundle_sha256,
        )

    def variant(self, variant_id: str) -> ServedVariant:
        for v in self.ladder:
            if v.id == variant_id:
                return v
        raise AgentError(f"variant {variant_id!r} is not loaded; loaded: {[v.id for v in self.ladder]}")


ObserveFn = Callable[[str, float], None]
ErrorFn = Callable[[str], None]
#: A post-answer tap: (model name, feeds, outputs, variant id) of one answered request (ModelServer.taps).
Tap = Callable[[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray], str], None]


def _noop_observe(variant_id: str, seconds: float) -> None:
    return None


def _noop_error(kind: str) -> None:
    return None


LoadFn = Callable[[dict[str, bytes]], LoadedModel]


def _default_open(bundle: Any, variant_id: str, device_key: Any, load: LoadFn) -> LoadedModel:
    """Decrypt in memory and load; the runtime session is built while the plaintext's signed
    hash is checked on a second thread, and is returned only once it matched."""
    import edgesdk.bundle

    model: LoadedModel = edgesdk.bundle.decrypt_and_load(bundle, variant_id, device_key, load)  # type: ignore[attr-defined]
    return model


def _open_with(decrypt: Callable[[Any, str, Any], dict[str, bytes]]) -> Callable[[Any, str, Any, LoadFn], LoadedModel]:
    """An opener around a plain ``decrypt(bundle, variant_id, key) -> files`` (tests)."""

    def open_variant(bundle: Any, variant_id: str, device_key: Any, load: LoadFn) -> LoadedModel:
        return load(decrypt(bundle, variant_id, device_key))

    return open_variant


def _return_freed_memory() -> None:
    """glibc keeps freed large blocks in the heap; on a 1 GB board the plaintext of a big model
    should not stay in the agent's RSS after the runtime copied it. No-op elsewhere."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return  # not glibc (musl, macOS)
    trim(0)


def gate_passed(variant: Variant) -> bool:
    """A variant may serve unless its accuracy gate failed. No result means the packager's host
    could not run that runtime (Core ML on Linux): it is served, and logged as unvalidated."""
    return variant.accuracy is None or variant.accuracy.passed


def speed_steps(variants: Sequence[Variant]) -> list[Variant]:
    """The variants the governor may step to: not ``off`` (never run where it was converted), and
    not ``size-only`` (slower than its fp32 on a CPU like the device's) unless nothing else is left."""
    usable = [v for v in variants if v.ladder_role != "off"]
    steps = [v for v in usable if v.ladder_role != "size-only"]
    for v in usable:
        if v.ladder_role == "size-only" and steps:
            log.info("variant %s not on the ladder: it is a size step only (not faster than fp32)", v.id)
    return steps or usable


def order_ladder(variants: Sequence[Variant], profile: DeviceProfile | None) -> list[list[Variant]]:
    """Group by precision, highest first; inside a group the profile's preferred runtime first."""
    preference = [str(getattr(r.runtime, "value", r.runtime)) for r in profile.runtimes] if profile else []
    formats = {str(getattr(f, "value", f)) for f in profile.formats} if profile else None

    def runtime_rank(v: Variant) -> int:
        name = str(getattr(v.runtime, "value", v.runtime))
        return preference.index(name) if name in preference else len(preference)

    groups: list[list[Variant]] = []
    for precision in PRECISION_LADDER:
        group = [
            v
            for v in variants
            if Precision(v.precision) == precision
            and (formats is None or str(getattr(v.format, "value", v.format)) in formats)
        ]
        if group:
            groups.append(sorted(group, key=runtime_rank))
    return groups


class ModelServer:
    """Holds the served model; ``infer`` is safe from many threads; ``swap``/``switch_variant`` are atomic."""

    def __init__(
        self,
        *,
        profile: DeviceProfile | None = None,
        events: EventBus | None = None,
        allow_nonfinite: bool = False,
        runtime_options: Mapping[str, str] | None = None,
        observe: ObserveFn | None = None,
        count_error: ErrorFn | None = None,
        batching: BatchingConfig | None = None,
        measured: Callable[[], DeviceMeasurements | None] | None = None,
    ) -> None:
        self.profile = profile
        # What `edge-agent profile` measured on this device (None: never profiled); read at each swap.
        self.measured = measured or (lambda: None)
        self.events = events or EventBus()
        self.allow_nonfinite = allow_nonfinite
        self.runtime_options = dict(runtime_options or {})
        self.observe = observe or _noop_observe
        self.count_error = count_error or _noop_error
        self.batching = batching or BatchingConfig()
        self.switch_count = 0
        #: The model serving now (None: none loaded). Read-only outside this class: ``serve``,
        #: ``swap`` and ``unload`` replace it in one assignment (a request takes it once). A plain
        #: attribute, not a property: the prepared route compares it on every answer.
        self.model: ServedModel | None = None
        self._running: RunningModel | None = None  # model described; changes with it, under _change_lock
        self._change_lock = threading.Lock()  # one swap/switch at a time; infer never takes it
        # Scans large float inputs for NaN/Inf while the model runs (see infer_with_variant).
        self.scans: ScanThread = shared_scan_thread()
        #: The device's other models by name, each with its own server (agent/device_models.py): a
        #: request naming one is handed to it, so the API routes by name through this server.
        self.others: Mapping[str, ModelServer] = {}
        #: Called once per answered request, after its answer is handed to the transport, on
        #: the thread that finished it: (model name, feeds, outputs, variant id). Every route
        #: that runs a model through this server's API calls them (``tap``), for the device's
        #: other models too. They must be cheap (enqueue to a worker of their own); one that
        #: raises is logged once and counted in ``tap_failures``, never raised into a request.
        self.taps: list[Tap] = []
        self.tap_failures = 0
        self._taps_logged: set[int] = set()  # id() of the taps whose failure was logged

    # -- loading ------------------------------------------------------------------------------

    def swap(
        self, verified_bundle: Any, device_key: Any, *, decrypt: Callable[..., dict[str, bytes]] | None = None
    ) -> ServedModel:
        """Decrypt and load every gated variant of ``verified_bundle`` in memory, then switch to it.

        The model serving now keeps serving if anything fails (AgentError with every reason).
        ``decrypt`` (tests) replaces decryption: ``decrypt(bundle, variant_id, key) -> files``.
        """
        from edgesdk.runtimes import load_variant

        open_variant = _default_open if decrypt is None else _open_with(decrypt)

        manifest = verified_bundle.manifest
        loaded: list[tuple[Variant, LoadedModel]] = []
        problems: list[str] = []
        choices = VariantChoices(self.profile, list(manifest.variants))
        eligible = []
        for v in manifest.variants:
            if self._eligible(v, problems):
                eligible.append(v)
            elif v.ladder_role == "off":
                choices.unvalidated(v)
            else:
                choices.failed_gate(v)
        # The device's own measurements of this release order the ladder; without them, the
        # converter's host timings (size-only variants are not speed steps).
        measured = self._measured_steps(manifest, eligible)
        steps = measured if measured is not eligible else speed_steps(eligible)
        for v in eligible:
            if v not in steps:
                if measured is not eligible:
                    choices.not_faster_here(v)
                else:
                    choices.size_step_only(v)
        groups = order_ladder(steps, self.profile)
        grouped = {v.id for group in groups for v in group}
        for v in steps:
            if v.id not in grouped:
                choices.not_for_profile(v)
        for group in groups:
            for rank, meta in enumerate(group):
                # Only the runtime keeps the plaintext bytes (if it needs them at all).
                load = functools.partial(
                    load_variant, meta.runtime, options=self._options_for(meta), execution=self._execution_for(meta)
                )
                try:
                    model = open_variant(verified_bundle, meta.id, device_key, load)
                    check_folded_input(getattr(manifest, "pipeline", None), meta, model)  # folded steps' dtype
                except IntegrityError as exc:
                    # Not this variant's problem but the bundle's: it changed since it was
                    # verified (rot, tampering). Serve none of it; the caller falls back.
                    for _, done in loaded:
                        done.close()
                    raise IntegrityError(f"{meta.id}: {exc}") from exc
                except EdgeSDKError as exc:
                    problems.append(f"{meta.id}: {exc}")
                    log.warning("variant %s not loaded: %s", meta.id, exc)
                    choices.did_not_load(meta, exc)
                    continue
                loaded.append((meta, model))
                choices.loaded(meta, rank, getattr(model, "execution", None))
                for other in group[rank + 1 :]:
                    choices.passed_over(other, meta)
                break  # one variant per precision
        _return_freed_memory()  # decrypted bytes are gone: give the heap they used back to the OS
        if not loaded:
            raise AgentError(
                f"no variant of {manifest.model.name} {manifest.model.version} could be loaded here: "
                + ("; ".join(problems) or "no variant matches this device's profile")
            )
        return self.serve(
            name=manifest.model.name,
            version=manifest.model.version,
            release=manifest.model.release,
            bundle_sha256=getattr(verified_bundle, "sha256", None),
            variants=loaded,
            choices=choices.result(),
            pipeline=getattr(manifest, "pipeline", None),
        )

    def _measured_steps(self, manifest: Any, eligible: list[Variant]) -> list[Variant]:
        """Only the steps of the device's measured speed ladder, when it measured this very model:
        a lower precision that is not faster here would cost accuracy for nothing."""
        measured = self.measured()
        if measured is None or (measured.model, measured.release) != (manifest.model.name, manifest.model.release):
            return eligible
        steps = [v for v in eligible if v.id in measured.speed_ladder]
        if not steps:
            return eligible
        for v in eligible:
            if v not in steps:
                log.info(
                    "variant %s is not a step on this device: %s", v.id, measured.not_steps.get(v.id, "not measured")
                )
        return steps

    def _eligible(self, meta: Variant, problems: list[str]) -> bool:
        if not gate_passed(meta):
            problems.append(f"{meta.id}: failed its accuracy gate")
            log.info("variant %s skipped: it failed its accuracy gate", meta.id)
            return False
        if meta.ladder_role == "off":
            problems.append(f"{meta.id}: unvalidated (never run where it was converted), never on the ladder")
            log.info("variant %s skipped: unvalidated, never on the governor's ladder", meta.id)
            return False
        if meta.accuracy is None:
            log.warning("variant %s has no accuracy result (unvalidated on the packaging host)", meta.id)
        return True

    def _options_for(self, meta: Variant) -> dict[str, str] | None:
        # The agent's runtime settings are onnxruntime's session options (runtime_threads,
        # runtime_spinning): other runtimes would take them as their own (OpenVINO passes every
        # option to compile_model), so they get none.
        onnxruntime = str(getattr(meta.runtime, "value", meta.runtime)) == "onnxruntime"
        return (dict(self.runtime_options) if onnxruntime else {}) or None

    def _execution_for(self, meta: Variant) -> ExecutionRequest | None:
        """The profile's providers, devices or delegates for the variant's runtime, preferred first."""
        if self.profile is None:
            return None
        support = next((r for r in self.profile.runtimes if r.runtime == meta.runtime), None)
        return ExecutionRequest.of(support.execution_providers) if support is not None else None

    def serve(
        self,
        *,
        name: str,
        version: str,
        release: int,
        variants: Sequence[tuple[Variant, LoadedModel]],
        bundle_sha256: str | None = None,
        start_variant: str | None = None,
        choices: Sequence[VariantChoice] = (),
        pipeline: Pipeline | None = None,
    ) -> ServedModel:
        """Serve already-loaded variants (best first) — the switch itself; ``swap`` ends here."""
        if not variants:
            raise AgentError(f"model {name!r}: no variants to serve")
        ladder = [ServedVariant(meta, model) for meta, model in variants]
        signature = Signature.from_specs([(v.inputs, v.outputs) for v in ladder], allow_nonfinite=self.allow_nonfinite)
        for v in ladder:
            v.takes_public_feeds = v.accepts_unadapted(signature)
        with self._change_lock:
            old = self.model
            active = ladder[0]
            if start_variant is not None:
                active = next((v for v in ladder if v.id == start_variant), active)
            model = ServedModel(name, version, release, bundle_sha256, ladder, signature, active)
            model.choices = tuple(choices) or tuple(
                VariantChoice(
                    v.id,
                    str(getattr(v.meta.format, "value", v.meta.format)),
                    str(v.runtime),
                    v.precision.value,
                    True,
                    "loaded",
                )
                for v in ladder
            )
            model.pipeline = pipeline
            model.former = self._former_for(model)
            running = model.running()  # built first: a bad hash fails here with the old model serving
            self.model = model  # the switch: one reference assignment
            self._running = running
        log.info(
            "serving %s %s (release %d), variants %s, active %s",
            name,
            version,
            release,
            [v.id for v in ladder],
            active.id,
        )
        self.events.emit(
            "model_loaded",
            {
                "model": name,
                "version": version,
                "release": release,
                "variant": active.id,
                "previous_model": f"{old.name} {old.version}" if old else None,
            },
        )
        return model

    def _former_for(self, model: ServedModel) -> BatchFormer | None:
        """The model's batch former when every input and output of its public signature (so of
        every variant) has a dynamic first axis; None otherwise. Pool requests wait in it only
        when ``[api.batching]`` is on for the model."""
        settings = self.batching.for_model(model.name)
        signature = model.signature
        if not has_batch_axis([s.shape for s in signature.inputs], [s.shape for s in signature.outputs]):
            if settings.enabled:
                log.info("dynamic batching is on but %s has no dynamic batch axis: one request per run", model.name)
            return None
        return BatchFormer(model.run_active, settings)

    def unload(self) -> None:
        """Stop serving (requests in flight finish on what they hold)."""
        with self._change_lock:
            self.model = None
            self._running = None

    # -- switching ----------------------------------------------------------------------------

    def switch_variant(self, variant_id: str, reason: str) -> bool:
        """Make ``variant_id`` active; False when it already is. Logged, counted, emitted."""
        with self._change_lock:
            model = self._require_model()
            target = model.variant(variant_id)
            previous = model.active
            if target is previous:
                return False
            running = model.running(target)
            model.active = target  # atomic: requests read it once
            self._running = running
            self.switch_count += 1
        log.info("precision switch %s -> %s (%s)", previous.id, target.id, reason)
        self.events.emit(
            "precision_switch",
            {
                "from": previous.id,
                "to": target.id,
                "from_precision": previous.precision.value,
                "to_precision": target.precision.value,
                "reason": reason,
                "switch_count": self.switch_count,
            },
        )
        return True

    # -- inference ----------------------------------------------------------------------------

    def _require_model(self) -> ServedModel:
        model = self.model
        if model is None:
            raise NoModelError("no model is loaded (install a bundle with 'edge-agent install FILE.edgepkg')")
        return model

    def get_model(self, model_name: str) -> ServedModel:
        """The served model called ``model_name`` (this server's or another model's); ModelNotFoundError otherwise."""
        model = self.model
        if model is not None and model.name == model_name:
            return model
        others = self.others
        other = others.get(model_name)
        if other is not None:
            return other.get_model(model_name)
        if model is None and not others:
            model = self._require_model()  # raises NoModelError
        served = sorted([*([model.name] if model is not None else []), *others])
        raise ModelNotFoundError(f"model {model_name!r} is not served here; served: {served}")

    def infer(self, model_name: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate ``feeds`` against the public signature and run the active variant."""
        return self.infer_with_variant(model_name, feeds)[0]

    def infer_with_variant(self, model_name: str, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
        """Like ``infer``; also returns the id of the variant that ran."""
        model = self.model
        if model is None or model.name != model_name:
            other = self.others.get(model_name)
            if other is not None:
                return other.infer_with_variant(model_name, feeds)  # another model of this device
            # Raises the right error (unless a swap just landed), which the answer counts
            # (agent/api/refusal.py): counted here too, one request was two errors, and a request
            # a swap let through was counted as refused.
            model = self.get_model(model_name)
        former = model.former
        if former is not None and former.pooled:
            return self._infer_batched(model, former, feeds)
        variant = model.active  # taken once: this request finishes on this variant
        try:
            # Everything but the NaN/Inf scan of large float inputs when the variant's run leaves
            # a core idle to scan them on (those are returned instead).
            deferred = model.signature.check_deferring_scans(feeds, variant.scan_min_bytes)
        except InferenceInputError:
            self.count_error("bad_input")
            raise
        if deferred is None:  # nothing left to scan (scanned already, or NaN/Inf allowed)
            return self._run_counted(variant.run_checked, feeds, variant.id), variant.id
        # The large inputs' NaN/Inf scan (45-60 µs for a 224x224 image, cold in the caches after
        # the previous run) runs on the scan thread while this one runs the model (the runtime
        # releases the GIL), and the outputs are returned only once it found nothing. A request
        # with NaN/Inf is refused exactly as if it had been scanned first (same error, counted
        # as bad_input); the model just ran for nothing.
        scan = self.scans.submit(deferred)
        if scan is None:  # no thread can take it (interpreter shutting down): scan here, first
            self._refuse_nonfinite(first_nonfinite(deferred))
        start = time.perf_counter()
        try:
            outputs = variant.run_checked(feeds)
        except Exception as exc:  # noqa: BLE001 - counted once and raised again (_raise_failed_run)
            # NaN fed to the runtime (or to an int8 variant's quantizer) may make it fail: the
            # client must hear about its bad input, not about what that input did downstream.
            if scan is not None:
                self._refuse_nonfinite(self.scans.result(scan), exc)
            self._raise_failed_run(exc)
        elapsed = time.perf_counter() - start
        if scan is not None:
            bad = self.scans.result(scan)
            if bad is not None:
                self._refuse_nonfinite(bad)  # the outputs computed from it are dropped
        self.observe(variant.id, elapsed)
        return outputs, variant.id

    def infer_stream(
        self, model_name: str, calls: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[list[dict[str, np.ndarray]], str]:
        """A streaming model over one request's ``calls`` (ServedVariant.run_stream), each checked
        against the public signature first; one latency observed for them all."""
        model = self.model
        if model is None or model.name != model_name:
            other = self.others.get(model_name)
            if other is not None:
                return other.infer_stream(model_name, calls)
            model = self.get_model(model_name)
        variant = model.active  # taken once: every call of the request runs on this variant
        try:
            for call in calls:
                model.signature.check(call)
        except InferenceInputError:
            self.count_error("bad_input")
            raise
        return self._run_counted(variant.run_stream, calls, variant.id), variant.id

    def _run_counted(self, run: Callable[[_Request], _Outputs], request: _Request, variant_id: str) -> _Outputs:
        """``run(request)`` timed and observed for ``variant_id``; a failure counted as the
        client's (bad_input) or the runtime's, then raised."""
        start = time.perf_counter()
        try:
            outputs = run(request)
        except Exception as exc:  # noqa: BLE001 - counted once and raised again (_raise_failed_run)
            self._raise_failed_run(exc)
        self.observe(variant_id, time.perf_counter() - start)
        return outputs

    def _raise_failed_run(self, exc: Exception) -> NoReturn:
        """Count a failed run once, as the client's (bad_input) or the runtime's, and raise it.
        An exception the runtime did not translate is raised as the RuntimeBackendError it was
        counted as: the answer counts that no second time and shows only the type (as anything
        else it was counted ``internal`` too: one request read as two failures); its traceback
        is logged here."""
        if isinstance(exc, InferenceInputError):
            self.count_error("bad_input")
            raise exc
        self.count_error("runtime")
        if isinstance(exc, RuntimeBackendError):
            raise exc
        log.error("the model's run failed", exc_info=exc)
        raise RuntimeBackendError(f"the model's run failed: {type(exc).__name__}") from exc

    def _infer_batched(
        self, model: ServedModel, former: BatchFormer, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], str]:
        """``infer_with_variant`` through the model's batch former. Every check, the NaN/Inf scan of every input
        included, is done before the request joins a batch: a bad request is refused alone and
        never reaches (or fails) the others. Latency observed = queue wait + batch run."""
        start = time.perf_counter()
        try:
            model.signature.check(feeds)
        except InferenceInputError:
            self.count_error("bad_input")
            raise
        try:
            outputs, variant_id = former.run(feeds)
        except Exception as exc:  # noqa: BLE001 - counted once and raised again (_raise_failed_run)
            self._raise_failed_run(exc)  # every request of a failed batch is counted
        self.observe(variant_id, time.perf_counter() - start)
        return outputs, variant_id

    def tap(
        self, model_name: str, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], variant_id: str
    ) -> None:
        """Call every tap with one answered request (callers check ``if server.taps:`` first, so
        an agent without taps pays one test per answer)."""
        for tap in self.taps:
            try:
                tap(model_name, feeds, outputs, variant_id)
            except Exception:  # noqa: BLE001 - a tap never fails the request it watches
                self.tap_failures += 1
                if id(tap) not in self._taps_logged:
                    self._taps_logged.add(id(tap))
                    log.exception("tap %r failed (logged once; counted in tap_failures)", tap)

    def _refuse_nonfinite(self, name: str | None, cause: BaseException | None = None) -> None:
        """Count and raise the NaN/Inf error for input ``name``; nothing when ``name`` is None."""
        if name is not None:
            self.count_error("bad_input")
            raise nonfinite_error(name) from cause

    # -- status -------------------------------------------------------------------------------

    def running_model(self) -> RunningModel | None:
        """What is serving now (None before a model is loaded): the one value the API, metrics,
        the MQTT link and the updater report. Built when the model or its variant changes."""
        return self._running

    def describe_models(self) -> list[dict[str, Any]]:
        """This server's model, then the device's other models."""
        others = [described for other in self.others.values() for described in other.describe_models()]
        model = self.model
        if model is None:
            return others
        return [
            {
                "name": model.name,
                "version": model.version,
                "release": model.release,
                "active_variant": model.active.id,  # the variant of running_model(), same instant
                "variants": [v.describe() for v in model.ladder],
                "bundle_variants": self.describe_variant_choices(),
                **model.signature.describe(),
                **({"pipeline_backends": steps} if (steps := step_backends(model.pipeline)) else {}),
            },
            *others,
        ]

    def describe_variant_choices(self) -> list[dict[str, Any]]:
        """Every variant of the served bundle: loaded (and active), or why it is not."""
        model = self.model
        if model is None:
            return []
        return [c.describe(model.active.id) for c in model.choices]
