"""The sideload: ``edge-agent install FILE.edgepkg`` into the model the bundle names.

It runs the OTA install path (verify, budget, stage, smoke-test, activate, commit) through
that model's updater; an agent installed without the OTA module runs the same steps here
directly. Either way the serving slot is kept until the new bundle has loaded, and an expired
trust document refuses it (new content).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.ports import EventSink

from edgesdk.errors import EdgeSDKError

if TYPE_CHECKING:
    from edgesdk.agent.device_models import DeviceModels, ModelParts
    from edgesdk.agent.openers import OpenerFactory
    from edgesdk.agent.ota import UpdateManager
    from edgesdk.agent.trust import AgentTrust


class Sideload:
    """Installs a bundle file; ``make_updater`` raises ImportError without the OTA module."""

    def __init__(
        self,
        *,
        models: DeviceModels,
        trust: AgentTrust | None,
        make_updater: Callable[[ModelParts], UpdateManager],
        open_bundles: Callable[[], OpenerFactory],
        profile_name: str,
        events: EventSink,
    ) -> None:
        self.models, self.trust, self.make_updater = models, trust, make_updater
        self.open_bundles, self.profile_name, self.events = open_bundles, profile_name, events

    def install(self, path: Path) -> dict[str, Any]:
        """Install the bundle at ``path`` into its model's store; a summary of what now serves."""
        if self.trust is not None:
            self.trust.require_current()
        entry = self.models.entry(_bundle_model_name(path))
        updates = entry.updates
        if updates is None:
            try:
                updates = self.make_updater(entry)
            except ImportError:
                return self._install_directly(entry, path)
        state = updates.install_local(path)
        result = _installed_summary(entry)
        result["state"] = state.value
        return result

    def _install_directly(self, entry: ModelParts, path: Path) -> dict[str, Any]:
        store = entry.store
        opener = self.open_bundles()()
        try:
            verified = opener.verify(
                path,
                profile=self.profile_name,
                installed_release=store.installed_release(),
                rollback_floor=store.rollback_floor(),
            )
            self.models.admit(entry.name, verified.manifest)
            slot = store.stage(verified)
            store.activate(slot)
            try:
                opener.serve(entry.server, verified)
            except EdgeSDKError:
                store.rollback()
                raise
        finally:
            opener.close()
        store.commit()
        manifest = verified.manifest
        self.events.emit(
            "installed",
            {
                "model": manifest.model.name,
                "version": manifest.model.version,
                "release": manifest.model.release,
                "slot": slot,
            },
        )
        return _installed_summary(entry)


def _installed_summary(entry: ModelParts) -> dict[str, Any]:
    slot = entry.store.active_slot
    info = entry.store.slot_info(slot) if slot else None
    info = info or {}
    return {
        "model": info.get("name"),
        "version": info.get("version"),
        "release": info.get("release"),
        "slot": slot,
        "sha256": info.get("sha256"),
        "variants": [v.id for v in entry.server.model.ladder] if entry.server.model else [],
    }


def _bundle_model_name(path: Path) -> str:
    """The model a bundle file says it is (unverified: it only picks the store; the install
    verifies the bundle and refuses one whose verified name is another model's)."""
    from edgesdk.bundle import inspect_bundle
    from edgesdk.errors import UpdateError

    if not Path(path).is_file():
        raise UpdateError(f"bundle file {str(path)!r} not found")
    return inspect_bundle(path).manifest.model.name
