"""The real :class:`UpdateTarget`: each state's work done with the agent's own parts.

It gets the agent's parts as ports (:mod:`edgesdk.agent.ports`): ``Serving`` (the atomic
switch, ModelServer), ``Slots`` (the A/B store, SlotStore), ``Keyring`` (verification and
decryption keys) and, for MQTT chunk downloads, the ``UpdateChannel`` (the link).
Verification is ``verify_bundle``, the transfer is :mod:`edgesdk.agent.ota.transfer`. Each state
that verifies or decrypts opens a :class:`~edgesdk.agent.ports.BundleOpener` for its own work and
closes it after: by default the unseal helper, so the device key never enters the daemon
(:mod:`edgesdk.agent.openers`). Nothing here writes a decrypted model to disk, and nothing
removes the serving slot before the new one has committed.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from edgesdk.agent.openers import InProcessOpener, OpenerFactory
from edgesdk.agent.ota.hooks import NO_HOOKS, OtaHooks
from edgesdk.agent.ota.http_fetch import HttpDownload, HttpSettings, SourcesFailed
from edgesdk.agent.ota.machine import ProbationFailed, UpdateCancelled
from edgesdk.agent.ota.probation import ProbationMonitor
from edgesdk.agent.ota.smoke import smoke_test, split_golden
from edgesdk.agent.ota.transfer import ChunkReceiver, TransferLimits
from edgesdk.agent.ports import BundleOpener, Keyring, Serving, Slots, UpdateChannel

from edgesdk.errors import EdgeSDKError, IntegrityError, UpdateError
from edgesdk.protocol.chunks import decode_frame
from edgesdk.protocol.topics import OTA_CHUNK_REQUEST
from edgesdk.schemas.messages import ChunkRequest, Deployment, OtaStatus, RunningModel

log = logging.getLogger(__name__)

#: Room kept free beside a staged bundle (journal, queue, logs) before we call the disk full.
STAGING_HEADROOM_BYTES = 4 * 1024 * 1024


class AgentUpdateTarget:
    """Does the work of every update state on one running agent."""

    def __init__(
        self,
        ota_dir: Path,
        *,
        device_id: str,
        serving: Serving,
        slots: Slots,
        keyring: Keyring,
        profile_name: str | None,
        publish: Callable[[OtaStatus], None],
        link: UpdateChannel | None = None,
        hooks: OtaHooks = NO_HOOKS,
        open_bundles: OpenerFactory | None = None,
        transfer_limits: TransferLimits | None = None,
        http_settings: HttpSettings | None = None,
        admit: Callable[[Any], None] | None = None,
    ) -> None:
        self.ota_dir = ota_dir
        # Refuses a verified bundle's manifest before it is staged (the device's memory budget
        # across its models, agent/device_models.py); raises with the reason.
        self.admit = admit
        self.transfer_limits = transfer_limits or TransferLimits()
        self.http_settings = http_settings or HttpSettings()
        self.device_id = device_id
        self.serving = serving
        self.slots = slots
        self.keyring = keyring
        self.profile_name = profile_name
        self.link = link
        self._publish = publish
        self.hooks = hooks  # test seams (tests/faulty_agent.py); production passes none
        # Where bundles are verified and decrypted; the agent passes its unseal helper's factory.
        self.open_bundles: OpenerFactory = open_bundles or (lambda: InProcessOpener(keyring))
        self._receiver: ChunkReceiver | None = None
        self._receiver_lock = threading.Lock()
        # The model that served before activation, kept loaded during probation: rolling back
        # is then a reference switch (well under a second), not a decrypt-and-load.
        self._previous_model: Any = None
        self._golden: tuple[dict[str, Any], dict[str, Any], str] | None = None
        self._manifest: Any = None  # the activated bundle's: the shadow's per-output metrics
        # Free memory budget and governor pressure for the probation's shadow (agent/shadow/wiring.py).
        self.shadow_device: Any = None
        self.chunk_window = 4
        #: Counters of the MQTT downloads so far (diagnostics, tests, benchmarks).
        self.download_stats: dict[str, int] = {"requests": 0, "rerequests": 0, "bad_chunks": 0}

    # -- helpers ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _opener(self) -> Iterator[BundleOpener]:
        opener = self.open_bundles()
        try:
            yield opener
        finally:
            opener.close()  # the helper (and the device key it read) is gone with the state's work

    def _verify(self, opener: BundleOpener, path: Path, *, installed_release: int | None) -> Any:
        """Re-open a bundle already in a slot (no anti-rollback: it was checked when installed)."""
        return opener.verify(path, profile=self.profile_name, installed_release=installed_release)

    def _verify_install(self, opener: BundleOpener, path: Path) -> Any:
        """Verify a bundle to install: anti-rollback against the store's floor (which raises
        when it cannot be established: the install is then refused)."""
        slots = self.slots
        return opener.verify(
            path,
            profile=self.profile_name,
            installed_release=slots.installed_release(),
            rollback_floor=slots.rollback_floor(),
        )

    def on_chunk_frame(self, payload: bytes) -> None:
        """Link handler for ``ota/chunks/data``: hand the frame to the running download."""
        header, data = decode_frame(payload)
        with self._receiver_lock:
            receiver = self._receiver
        if receiver is not None:
            receiver.on_frame(header, data)

    def _request_chunks(self, deployment: Deployment, indices: list[int]) -> None:
        link = self.link
        if link is None:
            return
        request = ChunkRequest(
            device_id=self.device_id,
            deployment_id=deployment.deployment_id,
            bundle_sha256=deployment.bundle_sha256,
            indices=indices,
        )
        link.publish_now(OTA_CHUNK_REQUEST, request, qos=1)  # False when offline: the receiver asks again

    # -- UpdateTarget ---------------------------------------------------------------------------

    def download(
        self, deployment: Deployment, progress: Callable[[float], None], cancelled: Callable[[], bool]
    ) -> Path:
        local = self.ota_dir / f"{deployment.deployment_id}.edgepkg"
        if not deployment.artifact_sources() and not deployment.chunk_sha256 and local.exists():
            return local  # a sideload: install_local placed the file here before starting
        if not deployment.artifact_sources():
            return self._download_chunks(deployment, progress, cancelled)
        http = HttpDownload(
            deployment, self.ota_dir, settings=self.http_settings, limits=self.transfer_limits, hooks=self.hooks
        )
        try:
            return http.run(progress, cancelled)
        except SourcesFailed as failed:
            # Broker-only and air-gapped fleets still get the bytes: the chunks any URL
            # delivered are kept in the partial file, MQTT fetches only the rest.
            if not (deployment.mqtt_fallback and deployment.chunk_sha256 and self.link is not None):
                raise
            log.warning("%s; falling back to MQTT chunks", failed)
            try:
                return self._download_chunks(deployment, progress, cancelled)
            except UpdateCancelled:
                raise
            except UpdateError as exc:
                raise UpdateError(f"{failed}; MQTT chunks: {exc}") from exc

    def _download_chunks(
        self, deployment: Deployment, progress: Callable[[float], None], cancelled: Callable[[], bool]
    ) -> Path:
        receiver = ChunkReceiver(
            deployment,
            self.ota_dir,
            lambda indices: self._request_chunks(deployment, indices),
            window=self.chunk_window,
            hooks=self.hooks,
            limits=self.transfer_limits,
        )
        with self._receiver_lock:
            self._receiver = receiver
        try:
            return receiver.run(progress, cancelled)
        finally:
            with self._receiver_lock:
                self._receiver = None
            self.download_stats["requests"] += receiver.requests_sent
            self.download_stats["rerequests"] += receiver.rerequests
            self.download_stats["bad_chunks"] += receiver.bad_chunks

    def verify(self, deployment: Deployment, path: Path) -> None:
        with self._opener() as opener:
            self._verify_and_smoke(opener, deployment, path)

    def _verify_and_smoke(self, opener: BundleOpener, deployment: Deployment, path: Path) -> None:
        from edgesdk.runtimes import available_runtimes

        verified = self._verify_install(opener, path)
        model = verified.manifest.model
        if deployment.bundle_sha256 != verified.sha256:
            raise IntegrityError(f"bundle sha256 {verified.sha256} is not the deployment's {deployment.bundle_sha256}")
        if (model.name, model.version, model.release) != (
            deployment.model_name,
            deployment.model_version,
            deployment.release,
        ):
            raise UpdateError(
                f"bundle is {model.name} {model.version} (release {model.release}); the deployment announced "
                f"{deployment.model_name} {deployment.model_version} (release {deployment.release})"
            )
        available = {str(getattr(r, "value", r)) for r in available_runtimes()}
        smoke_test(
            verified,
            opener.decrypt,
            opener.golden(verified),
            runnable=lambda v: str(getattr(v.runtime, "value", v.runtime)) in available,
        )

    def stage(self, deployment: Deployment, path: Path) -> str:
        store = self.slots
        free = shutil.disk_usage(store.slots_dir).free
        needed = path.stat().st_size + STAGING_HEADROOM_BYTES
        self.hooks.before_write("stage", Path(store.slots_dir), needed)
        if free < needed:
            raise UpdateError(f"not enough disk space to stage: {free} bytes free, {needed} needed (ENOSPC)")
        with self._opener() as opener:
            verified = self._verify_install(opener, path)
            if self.admit is not None:
                self.admit(verified.manifest)  # before anything is written into a slot
            return str(store.stage(verified))

    def shadow_phase(self, deployment: Deployment, slot: str, cancelled: Callable[[], bool]) -> str:
        """Before activation: the staged bundle in ``slot`` shadows the serving model for
        ``health.shadow_s`` (agent/shadow/phase.py). Raises ProbationFailed when it is refused."""
        from edgesdk.agent.shadow.phase import run_shadow_phase

        manifest: list[Any] = []

        def load_staged(fits: Callable[[Any], str | None], server: Any) -> str | None:
            with self._opener() as opener:
                verified = self._verify(opener, self.slots.bundle_path(slot), installed_release=None)
                manifest.append(verified.manifest)
                why_not = fits(verified.manifest)  # the memory budget, before anything is decrypted
                if why_not is None:
                    opener.serve(server, verified)
                return why_not

        outcome = run_shadow_phase(
            deployment.health,
            self.serving,
            lambda: manifest[0],
            load_staged=load_staged,
            device=self.shadow_device,
            cancelled=cancelled,
        )
        if outcome.refused is not None:
            raise ProbationFailed(outcome.refused)
        log.info("%s", outcome.summary)
        return outcome.summary

    def _load_golden(self, opener: BundleOpener, verified: Any) -> tuple[dict[str, Any], dict[str, Any], str] | None:
        """Golden inputs/outputs for probation probes (in memory only)."""
        self._manifest = verified.manifest
        golden = opener.golden(verified)
        if not golden:
            return None
        inputs, expected = split_golden(golden)
        metric = verified.manifest.golden.metric if verified.manifest.golden else "top1"
        return inputs, expected, metric

    def activate(self, deployment: Deployment, slot: str) -> None:
        store = self.slots
        server = self.serving
        store.reload()
        with self._opener() as opener:
            verified = self._verify(opener, store.bundle_path(slot), installed_release=None)
            self._golden = self._load_golden(opener, verified)
            self._previous_model = server.model
            store.activate(slot)
            opener.serve(server, verified)  # raises with the old model still serving

    def probation(self, deployment: Deployment, started: datetime, restarts: int, cancelled: Callable[[], bool]) -> str:
        server = self.serving
        serving = server.model
        if serving is None:
            raise ProbationFailed("no model serving after activation")
        if (serving.name, serving.release) != (deployment.model_name, deployment.release):
            # e.g. the agent restarted and could not load the new slot, so it serves the old one:
            # judging (and committing) that model would report a lie.
            raise ProbationFailed(
                f"the new model is not serving: {serving.name} release {serving.release} is "
                f"(expected {deployment.model_name} release {deployment.release})"
            )
        if self._golden is None and deployment.health.probation_s > 0:
            # After a restart in probation the golden set is read again from the active slot.
            store = self.slots
            try:
                if store.active_slot is not None:
                    with self._opener() as opener:
                        verified = self._verify(opener, store.bundle_path(store.active_slot), installed_release=None)
                        self._golden = self._load_golden(opener, verified)
            except EdgeSDKError as exc:
                log.warning("probation runs without golden probes: %s", exc)
        shadow = self._start_shadow(deployment)
        try:
            monitor = ProbationMonitor(server, server.model.name, self._golden, shadow=shadow)
            summary = monitor.watch(deployment.health, started, cancelled)
        finally:
            shadow.stop()  # before any rollback serves the previous model again
        log.info("%s", summary)
        return summary

    def _start_shadow(self, deployment: Deployment) -> Any:
        """The previous release beside the new one on sampled live requests (agent/shadow)."""
        from edgesdk.agent.shadow.start import start_shadow

        def verify_and_load(fits: Callable[[Any], str | None], reference: Any) -> str | None:
            slot = self.slots.previous_slot
            with self._opener() as opener:
                verified = self._verify(opener, self.slots.bundle_path(slot), installed_release=None)
                why_not = fits(verified.manifest)  # the memory budget, before anything is decrypted
                if why_not is None:
                    opener.serve(reference, verified)
                return why_not

        return start_shadow(
            deployment.health,
            self.serving,
            self._manifest,
            previous=self._previous_model,
            slots=self.slots,
            verify_and_load=verify_and_load,
            device=self.shadow_device,
        )

    def commit(self, deployment: Deployment) -> None:
        store = self.slots
        store.reload()
        if store.active_slot is not None and not store.committed:
            store.commit()
        self._previous_model = None
        self._golden = None
        self._manifest = None

    def rollback(self, activated_slot: str | None) -> None:
        store = self.slots
        server = self.serving
        store.reload()
        if activated_slot is not None and store.active_slot == activated_slot:
            if store.rollback() is None:
                raise UpdateError(f"no previous good slot to roll back to; slot {activated_slot} keeps serving")
        active = store.active_slot
        if active is None:
            return
        info = store.slot_info(active) or {}
        serving = server.model
        if serving is not None and info.get("sha256") and serving.bundle_sha256 == info["sha256"]:
            return  # already serving the good slot (a resumed rollback, or activation never happened)
        previous = self._previous_model
        if previous is not None and previous.bundle_sha256 == info.get("sha256"):
            server.serve(
                name=previous.name,
                version=previous.version,
                release=previous.release,
                bundle_sha256=previous.bundle_sha256,
                variants=[(v.meta, v.loaded) for v in previous.ladder],
                start_variant=previous.active.id,
                choices=previous.choices,
                pipeline=previous.pipeline,  # /predict's steps come back with the model
            )
        else:
            with self._opener() as opener:
                opener.serve(server, self._verify(opener, store.bundle_path(active), installed_release=None))
        self._previous_model = None

    def discard(self, deployment: Deployment | None) -> None:
        if deployment is None:
            return
        for suffix in (".part", ".edgepkg"):
            (self.ota_dir / f"{deployment.deployment_id}{suffix}").unlink(missing_ok=True)

    def running_model(self) -> RunningModel | None:
        return self.serving.running_model()

    def publish(self, status: OtaStatus) -> None:
        self._publish(status)
