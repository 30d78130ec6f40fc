"""The agent's trust document: which publisher and operator keys it trusts now.

The image ships the first document (``trust_document`` in the config, read-only under
``/etc/edgesdk``). A newer one arrives retained on ``{namespace}/fleet/trust`` or by sideload
(``edge-agent trust install FILE``); it is checked against the *current* document's root
(:func:`edgesdk.trust.verify_update`: old and new root thresholds, a higher version, not
expired) and written atomically to ``data_dir/trust.json``, which from then on is the one
read. So a revoked key stays revoked across restarts, and the shipped file can never roll the
device back (it is only read while no newer document was installed).

Reading the fields needs no crypto; checking the signatures does, so the daemon with
``unseal = "helper"`` leaves that to the helper at start (it passes the document's path, and
the helper checks the document before it trusts its publisher keys), and does it itself when
the first deployment or trust update arrives.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.fsutil import atomic_write_bytes
from edgesdk.agent.ports import EventSink

from edgesdk.errors import AgentError, TrustError
from edgesdk.schemas.trust import TrustDocument
from edgesdk.trust.document import (
    document_bytes,
    load_document,
    parse_document,
    require_current,
    role_keys,
    verify_self,
    verify_update,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from edgesdk.agent.security_state import SecurityState

log = logging.getLogger(__name__)

#: Where an installed (newer than shipped) document is kept, inside ``data_dir``.
PERSISTED_NAME = "trust.json"


class AgentTrust:
    """The trusted document of one agent, and the way to replace it."""

    def __init__(
        self,
        shipped: Path,
        data_dir: Path,
        *,
        events: EventSink | None = None,
        state: SecurityState | None = None,
    ) -> None:
        self.shipped = Path(shipped)
        self.persisted = Path(data_dir) / PERSISTED_NAME
        self.events = events
        #: The device's security state: with it, the installed document is the one the record
        #: holds and ``trust.json`` only its copy (deleting or replacing the file changes nothing).
        self.state = state
        self._lock = threading.RLock()
        self._document: TrustDocument | None = None
        self._verified = False

    @property
    def path(self) -> Path:
        """The file in force: the installed one once there is one, else the shipped one."""
        if self.state is not None:
            try:
                return self.persisted if self._recorded(self.state) is not None else self.shipped
            except TrustError:
                pass  # tampered: installs and updates are refused elsewhere; report the file as before
        return self.persisted if self.persisted.exists() else self.shipped

    def _recorded(self, state: SecurityState) -> bytes | None:
        """The installed document the security state holds (its copy in ``trust.json`` restored
        when deleted or changed); None while the shipped one is in force. TrustError when the
        security state is missing or invalid."""
        try:
            text = state.read().trust_document
        except AgentError as exc:
            raise TrustError(f"trust document in force unknown: {exc}") from exc
        if text is None:
            return None
        raw = text.encode()
        try:
            if self.persisted.read_bytes() == raw:
                return raw
        except OSError:
            pass
        log.warning("%s was deleted or changed: restored from the security state", self.persisted)
        try:
            atomic_write_bytes(self.persisted, raw, mode=0o644)
        except OSError as exc:
            raise TrustError(f"cannot restore trust document {self.persisted}: {exc.strerror or exc}") from exc
        return raw

    def document(self) -> TrustDocument:
        """The document in force, read (not verified) on first use."""
        with self._lock:
            if self._document is None:
                if self.state is None:
                    self._document = load_document(self.path)
                else:
                    raw = self._recorded(self.state)
                    self._document = (
                        load_document(self.shipped)
                        if raw is None
                        else parse_document(raw, source=f"trust document in {self.state.path}")
                    )
                self._verified = False
            return self._document

    def verified(self) -> TrustDocument:
        """The document in force after a threshold of its own root keys is checked (once)."""
        with self._lock:
            document = self.document()
            if not self._verified:
                verify_self(document)
                self._verified = True
            return document

    def reload(self) -> None:
        """Read the file again on next use (``edge-agent trust install`` replaced it; SIGHUP)."""
        with self._lock:
            self._document = None
            self._verified = False

    def publisher_keys(self) -> list[Ed25519PublicKey]:
        """The keys that may sign bundles (also while expired: installed bundles keep serving)."""
        return role_keys(self.verified().roles.publisher)

    def operator_keys(self) -> list[Ed25519PublicKey]:
        """The keys that may sign deployments; TrustExpiredError once the document has expired."""
        document = self.verified()
        require_current(document)
        return role_keys(document.roles.operator)

    def require_current(self) -> None:
        """TrustExpiredError when the document in force has expired (new content is refused)."""
        require_current(self.document())

    def install(self, raw: bytes, *, source: str) -> tuple[TrustDocument, bool]:
        """Replace the document in force with ``raw`` if it may (see the module docstring).

        Returns the document in force and whether it changed; the very document already in
        force (a retained message seen again at reconnect) changes nothing. Raises TrustError
        (or its TrustRollbackError / TrustExpiredError) naming why it was refused."""
        new = parse_document(raw, source=source)
        with self._lock:
            current = self.verified()
            if new == current:
                return current, False
            verify_update(current, new)
            if self.state is not None:
                # The record first: from then on it is the document in force; the file is its copy.
                text = document_bytes(new).decode()
                try:
                    self.state.update(
                        lambda record: record.model_copy(update={"trust_document": text, "trust_version": new.version})
                    )
                except AgentError as exc:
                    raise TrustError(f"trust document version {new.version} refused: {exc}") from exc
            try:
                atomic_write_bytes(self.persisted, document_bytes(new), mode=0o644)
            except OSError as exc:
                raise TrustError(f"cannot store trust document in {self.persisted}: {exc.strerror or exc}") from exc
            self._document, self._verified = new, True
        log.info("trust document version %d installed from %s", new.version, source)
        return new, True

    def on_message(self, payload: bytes) -> None:
        """Link handler for ``{namespace}/fleet/trust``: install, and report either way."""
        try:
            document, changed = self.install(payload, source="trust message")
        except TrustError as exc:
            log.warning("refused trust document: %s", exc)
            self._emit("trust_refused", {"reason": str(exc)})
            return
        if changed:
            self._emit("trust_updated", {"version": document.version, "expires_at": document.expires_at.isoformat()})

    def report_expiry(self) -> str | None:
        """A problem line (and a ``trust_expired`` event) when the document in force has expired."""
        try:
            document = self.document()
        except TrustError as exc:
            return f"trust: {exc}"
        if not document.is_expired(datetime.now(timezone.utc)):
            return None
        problem = (
            f"trust document version {document.version} expired at {document.expires_at.isoformat()}: "
            "deployments and installs are refused until a newer one arrives"
        )
        self._emit("trust_expired", {"version": document.version, "expires_at": document.expires_at.isoformat()})
        return problem

    def status(self) -> dict[str, Any]:
        """For /v1/status: the document in force, read without crypto."""
        try:
            document = self.document()
        except TrustError as exc:
            return {"path": str(self.path), "error": str(exc)}
        return {
            "path": str(self.path),
            "version": document.version,
            "expires_at": document.expires_at.isoformat(),
            "expired": document.is_expired(datetime.now(timezone.utc)),
            "publisher_keys": sorted(document.roles.publisher.keys),
            "operator_keys": sorted(document.roles.operator.keys),
        }

    def _emit(self, name: str, detail: dict[str, Any]) -> None:
        if self.events is not None:
            self.events.emit(name, detail)
