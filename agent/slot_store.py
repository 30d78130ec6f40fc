"""A/B slots of installed bundles, kept ENCRYPTED on disk.

Layout under the agent's data dir::

    slots/a/bundle.edgepkg     the bundle exactly as published (encrypted payloads)
    slots/b/bundle.edgepkg
    slots/a/committed          the release slot a committed (anti-rollback, see below)
    store.json                 which slot is active, which was before, which are proven
    store.lock                 serialises writers (the daemon and ``edge-agent install``)
    rollback_floor             append-only floor records (:mod:`edgesdk.agent.rollback_floor`)

A new bundle is staged into the slot that is not active, then activated, then committed
once it has proven itself (the OTA probation, or at once for a sideload). The serving slot
is never overwritten before the new one is proven: staging always targets the other slot.
At start, :meth:`SlotStore.load_active` checks the active slot again and falls back to the
last proven slot when it fails, reporting why. The check is
``edgesdk.bundle.verify_installed_bundle``: signature, manifest, target, and that header +
manifest are the ones installed (``front_sha256`` recorded at staging). The payloads are not
re-hashed at start (that would cost as much again as creating the session): decryption
authenticates every byte it loads (GCM tags + signed plaintext SHA-256), so a bundle that
rotted on an SD card fails when its variants are loaded, and the daemon then rolls back to
the last good slot. A slot staged before ``front_sha256`` was recorded is fully re-verified.

Anti-rollback does not trust ``store.json``: :meth:`SlotStore.rollback_floor` is the floor of
:class:`~edgesdk.agent.rollback_floor.RollbackFloor` (a monotonic counter plus per-slot records,
each fsynced on its own), raised when a slot *commits*, so a rollback during probation still
works; every install path checks against it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from edgesdk.agent.fsutil import atomic_write_json, fsync_dir
from edgesdk.agent.rollback_floor import MonotonicCounter, RecordedFloor, RollbackFloor

from edgesdk.errors import AgentError, EdgeSDKError, IntegrityError
from edgesdk.hashing import sha256_file

log = logging.getLogger("edgesdk.agent.slot_store")

Slot = Literal["a", "b"]
SLOTS: tuple[Slot, Slot] = ("a", "b")
BUNDLE_FILE = "bundle.edgepkg"
_COPY_CHUNK = 1 << 20


def _other(slot: Slot | None) -> Slot:
    return "b" if slot == "a" else "a"


def _default_verify(path: Path, **kwargs: Any) -> Any:
    import edgesdk.bundle

    return edgesdk.bundle.verify_bundle(path, **kwargs)  # type: ignore[attr-defined]


def _default_verify_installed(path: Path, **kwargs: Any) -> Any:
    import edgesdk.bundle

    return edgesdk.bundle.verify_installed_bundle(path, **kwargs)  # type: ignore[attr-defined]


class SlotStore:
    """One model's A/B slots of bundles on disk. Every change is persisted atomically before it counts."""

    def __init__(
        self,
        data_dir: Path,
        *,
        verify: Callable[..., Any] | None = None,
        verify_installed: Callable[..., Any] | None = None,
        counter: MonotonicCounter | None = None,
        recorded_floor: RecordedFloor | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.slots_dir = self.data_dir / "slots"
        self.state_path = self.data_dir / "store.json"
        self._lock_path = self.data_dir / "store.lock"
        self._verify = verify or _default_verify
        self._verify_installed = verify_installed or _default_verify_installed
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for slot in SLOTS:
            (self.slots_dir / slot).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._state = self._read_state()
        #: The anti-rollback floor; ``counter`` replaces its file-backed monotonic counter.
        #: ``recorded_floor`` is the floor in the device's security state, which the files cannot lower.
        self.floor = RollbackFloor(
            self.data_dir, SLOTS, counter=counter, bundle_file=BUNDLE_FILE, recorded=recorded_floor
        )
        #: What the last ``load_active`` found: slot used, problems met, whether it fell back.
        self.load_report: dict[str, Any] = {}

    # -- state ------------------------------------------------------------------------------

    def _read_state(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"active": None, "previous": None, "committed": False, "slots": {}}
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return empty
        except (OSError, ValueError) as exc:
            # A torn state file cannot happen with atomic writes, but a bad disk can do anything.
            log.error("store state %s unreadable (%s); starting with an empty store", self.state_path, exc)
            return empty
        if not isinstance(data, dict) or data.get("active") not in (None, *SLOTS):
            log.error("store state %s malformed; starting with an empty store", self.state_path)
            return empty
        return {**empty, **data}

    def _save(self) -> None:
        atomic_write_json(self.state_path, self._state)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive across processes; re-reads the state so another writer's change is seen."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._state = self._read_state()
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def reload(self) -> None:
        """Re-read ``store.json`` (after ``edge-agent install`` changed it)."""
        self._state = self._read_state()

    @property
    def active_slot(self) -> Slot | None:
        return self._state["active"]

    @property
    def previous_slot(self) -> Slot | None:
        return self._state["previous"]

    @property
    def committed(self) -> bool:
        """True when the active slot has been committed (proven)."""
        return bool(self._state["committed"])

    def slot_info(self, slot: Slot) -> dict[str, Any] | None:
        """What was recorded when ``slot`` was staged (name, version, release, sha256, good)."""
        info = self._state["slots"].get(slot)
        return dict(info) if info else None

    def bundle_path(self, slot: Slot) -> Path:
        return self.slots_dir / slot / BUNDLE_FILE

    def installed_release(self) -> int | None:
        """Release counter of the active slot as ``store.json`` says, None when empty or lost.

        Not the anti-rollback floor: that is :meth:`rollback_floor`, which survives the loss of
        this file."""
        active = self.active_slot
        info = self._state["slots"].get(active) if active else None
        return int(info["release"]) if info else None

    def rollback_floor(self) -> int | None:
        """The lowest release an install may bring (None on a device that never installed).

        Raises :class:`~edgesdk.errors.RollbackFloorUnknownError` when this device installed
        before but no record of it survives: installs must then be refused."""
        return self.floor.floor()

    def snapshot(self) -> dict[str, Any]:
        """A copy of the persisted state, for status pages."""
        return json.loads(json.dumps(self._state))

    # -- changes ----------------------------------------------------------------------------

    def stage(self, verified: Any) -> Slot:
        """Copy a verified bundle (still encrypted) into the inactive slot; returns the slot.

        The copy is hashed on the way and must match the hash taken at verification, so a
        file swapped on disk between verify and stage is refused.
        """
        with self._locked():
            slot = _other(self.active_slot)
            target = self.bundle_path(slot)
            tmp = target.with_name(f".{BUNDLE_FILE}.tmp-{os.getpid()}")
            digest = hashlib.sha256()
            # The slot's old release no longer lives there once the copy replaces it.
            self.floor.slot_staging(slot)
            try:
                with open(verified.path, "rb") as src, open(tmp, "wb") as dst:
                    os.fchmod(dst.fileno(), 0o600)
                    while chunk := src.read(_COPY_CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                    dst.flush()
                    os.fsync(dst.fileno())
                if digest.hexdigest() != verified.sha256:
                    raise IntegrityError(
                        f"bundle {str(verified.path)!r} changed after it was verified "
                        f"(sha256 {digest.hexdigest()} != {verified.sha256})"
                    )
                os.replace(tmp, target)
            except OSError as exc:
                raise AgentError(f"cannot stage bundle into slot {slot}: {exc}") from exc
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(target.parent)
            manifest = verified.manifest
            self._state["slots"][slot] = {
                "name": manifest.model.name,
                "version": manifest.model.version,
                "release": manifest.model.release,
                "sha256": verified.sha256,
                "front_sha256": getattr(verified, "front_sha256", None),
                "staged_at": time.time(),
                "good": False,
            }
            downgrade = getattr(manifest, "downgrade", None)
            if downgrade is not None:
                # Re-checked when the slot commits and the floor is lowered to this release.
                self._state["slots"][slot]["downgrade_from"] = list(downgrade.from_releases)
            if self._state["previous"] == slot:
                self._state["previous"] = None  # its old content is gone
            self._save()
            log.info(
                "staged %s %s (release %d) into slot %s",
                manifest.model.name,
                manifest.model.version,
                manifest.model.release,
                slot,
            )
            return slot

    def activate(self, slot: Slot) -> None:
        """Make ``slot`` the one to serve; the current one becomes ``previous`` (uncommitted)."""
        if slot not in SLOTS:
            raise AgentError(f"unknown slot {slot!r}; known: a, b")
        with self._locked():
            if slot not in self._state["slots"]:
                raise AgentError(f"slot {slot} holds no staged bundle")
            if self._state["active"] != slot:
                self._state["previous"] = self._state["active"]
            self._state["active"] = slot
            self._state["committed"] = False
            self._save()
            log.info("activated slot %s (previous %s)", slot, self._state["previous"])

    def commit(self) -> None:
        """The active slot has proven itself: it becomes the last good one, and the rollback
        floor rises to its release (or, for a signed downgrade, is lowered to it) before
        ``store.json`` says so."""
        with self._locked():
            active = self._state["active"]
            if active is None:
                raise AgentError("nothing to commit: no active slot")
            info = self._state["slots"][active]
            front = info.get("front_sha256")
            downgrade_from = info.get("downgrade_from")
            self.floor.committed(
                active,
                int(info["release"]),
                downgrade_from=(int(downgrade_from[0]), int(downgrade_from[1])) if downgrade_from else None,
                evidence=bytes.fromhex(front) if front else b"\0" * 32,
            )
            self._state["committed"] = True
            self._state["slots"][active]["good"] = True
            self._save()
            log.info("committed slot %s", active)

    def rollback(self) -> Slot | None:
        """Go back to the previous good slot; returns it, or None when there is none."""
        with self._locked():
            previous = self._state["previous"]
            info = self._state["slots"].get(previous) if previous else None
            if previous is None or not info or not info.get("good"):
                log.warning("rollback requested but no previous good slot")
                return None
            failed = self._state["active"]
            self._state["active"] = previous
            self._state["previous"] = None
            self._state["committed"] = True
            if failed in self._state["slots"]:
                self._state["slots"][failed]["good"] = False
            self._save()
            log.warning("rolled back from slot %s to slot %s", failed, previous)
            return previous

    # -- start --------------------------------------------------------------------------------

    def _verify_slot(self, slot: Slot, trusted_publishers: Any, profile: Any, verifier: Any = None) -> Any:
        verify = verifier.verify if verifier is not None else self._verify
        verify_installed = verifier.verify_installed if verifier is not None else self._verify_installed
        path = self.bundle_path(slot)
        if not path.is_file():
            raise AgentError(f"slot {slot}: {path} is missing")
        profile_name = getattr(profile, "name", profile)
        info = self._state["slots"].get(slot) or {}
        if info.get("sha256") and info.get("front_sha256"):
            return verify_installed(
                path,
                trusted_publishers=trusted_publishers,
                profile=profile_name,
                installed_front_sha256=info["front_sha256"],
                installed_sha256=info["sha256"],
            )
        # Expiry stops installing a stale bundle, not serving the one installed.
        verified = verify(path, trusted_publishers=trusted_publishers, profile=profile_name, allow_expired=True)
        expected = info.get("sha256")
        if expected and verified.sha256 != expected:
            raise IntegrityError(f"slot {slot}: bundle sha256 {verified.sha256} is not the one installed ({expected})")
        return verified

    def check_file(self, slot: Slot) -> str | None:
        """Re-hash ``slot``'s bundle file against the SHA-256 recorded when it was staged.

        Returns what is wrong, or None when it matches (or nothing was recorded). The agent
        runs this in the background after start, since start-up itself re-authenticates only
        the payloads it loads."""
        expected = (self._state["slots"].get(slot) or {}).get("sha256")
        if not expected:
            return None
        try:
            actual = sha256_file(self.bundle_path(slot))
        except OSError as exc:
            return f"slot {slot}: bundle file unreadable: {exc.strerror or exc}"
        if actual != expected:
            return (
                f"slot {slot}: bundle file changed since it was installed (sha256 {actual}, "
                f"installed {expected}); the variants serving now were authenticated when they loaded"
            )
        return None

    def load_active(self, trusted_publishers: Any, profile: Any, *, verifier: Any = None) -> Any:
        """Verify and return the active bundle; on failure fall back to the last good slot.

        ``verifier`` (an :class:`~edgesdk.agent.unseal.Unsealer`) verifies in its helper
        process instead of here.

        Returns None when no slot holds a usable bundle. ``load_report`` says what happened;
        a fallback is persisted (the good slot becomes active) so the next install stages
        over the broken one and never over the one serving.
        """
        problems: list[str] = []
        candidates: list[Slot] = []
        active = self.active_slot
        if active is not None:
            candidates.append(active)
        for slot in (self.previous_slot, _other(active)):
            info = self._state["slots"].get(slot) if slot else None
            if slot and slot not in candidates and info and info.get("good"):
                candidates.append(slot)
        for slot in candidates:
            try:
                verified = self._verify_slot(slot, trusted_publishers, profile, verifier)
            except EdgeSDKError as exc:
                problems.append(f"slot {slot}: {exc}")
                log.error("installed bundle in slot %s failed verification: %s", slot, exc)
                continue
            fell_back = slot != active
            if fell_back:
                with self._locked():
                    self._state["previous"] = None
                    self._state["active"] = slot
                    self._state["committed"] = True
                    if active in self._state["slots"]:
                        self._state["slots"][active]["good"] = False
                    self._save()
                log.warning("started on last good slot %s instead of broken slot %s", slot, active)
            self.load_report = {"slot": slot, "fell_back": fell_back, "problems": problems}
            return verified
        self.load_report = {"slot": None, "fell_back": False, "problems": problems}
        return None
