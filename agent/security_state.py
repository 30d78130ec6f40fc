"""The device's security state: one authenticated record that fails closed as a whole.

What keeps an older release, trust document or command out lives in one file,
``data_dir/security_state.json``:

* the **trust document** in force, when a newer one than the image's was installed (its whole
  text: ``trust.json`` is only a copy of it that the unseal helper reads);
* the **release floor** of every model (the anti-rollback floor, ``rollback_floor.py``);
* the **command ledger**: the last accepted sequence per operator key (``ota/freshness.py``).

The record is JSON with an HMAC-SHA256 beside it, keyed with HKDF-SHA256 of the device's
private key (``info = "edgesdk security state"``). With ``unseal = "helper"`` the helper derives
that key (op ``state_key``), so the daemon still never holds the device key. Every change is
read–modify–write under a file lock (the daemon and ``edge-agent install`` / ``trust install``
may both write), and written temp + fsync + rename + fsync-dir.

The record is made **with the device key**: the agent writes an empty one in the moment it
creates ``data_dir/device.key`` (first start, ``edge-agent key``, an image's first boot), and a
key made elsewhere (``edgesdk keys device``, a configured ``device_key``) gets its record once from
``edge-agent security-state seed`` before the agent runs with it. From then on the rule is strict,
checked at every start (:meth:`SecurityState.open`):

==============================================  ===============================================
record                                          the device
==============================================  ===============================================
present, MAC valid                              uses it
absent (whatever else the data dir holds), or   **tampered**: installs, commands and trust
present with a bad MAC / unreadable             updates are refused; the model that serves goes
                                                on serving; ``/v1/status`` reports it and a
                                                ``security_state_tampered`` event is sent
==============================================  ===============================================

So deleting ``trust.json``, ``models/``, the ledger, the record, or all of them, changes nothing
an attacker wants: a device key without a valid record is tampered with. Recovery is an
operator-signed re-provision command over MQTT (``edgesdk fleet reprovision``, the floors it
states, :func:`reprovisioned_record`), re-enrollment (a new device key is a new record), or
``edge-agent security-state seed``, run by someone who holds the device (it needs the device
key): it writes a new record from the files as they are. The same command is the one-time step
after upgrading from an agent that had no record, or that made its key before the record came
with it: seeding automatically would let anyone who deletes the record choose what it is seeded
from (docs/security.md, "Device security state").

Residual risks (docs/security.md): whoever can read the device key can forge the record; a
rollback of the whole data partition to an older snapshot (record included) is not seen without
a hardware counter (the :class:`~edgesdk.agent.rollback_floor.MonotonicCounter` port, for TPM NV
or eMMC RPMB); and deleting the device key too makes a new device (a new key, a new record) that
the fleet sees as a re-key request needing approval.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.fsutil import atomic_write_bytes
from pydantic import Field, ValidationError

from edgesdk.errors import AgentError
from edgesdk.schemas.base import Schema

if TYPE_CHECKING:
    from edgesdk.schemas.agent_config import AgentConfig

log = logging.getLogger("edgesdk.agent.security_state")

STATE_FILE = "security_state.json"
_LOCK_FILE = ".security_state.lock"
_KDF_INFO = b"edgesdk security state"
SCHEMA_VERSION = 1


def derive_state_key(device_private_raw: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869, zero salt) of the raw device private key: 32 bytes."""
    prk = hmac.new(b"\0" * 32, device_private_raw, hashlib.sha256).digest()
    return hmac.new(prk, _KDF_INFO + b"\x01", hashlib.sha256).digest()


class LedgerEntry(Schema):
    """The last command accepted from one signing key."""

    sequence: int = Field(ge=0)
    digest: str


class SecurityRecord(Schema):
    """The authenticated content of ``security_state.json``."""

    schema_version: int = SCHEMA_VERSION
    trust_document: str | None = Field(
        None, description="the installed trust document's JSON text; None while the image's one is in force"
    )
    trust_version: int | None = None
    release_floors: dict[str, int] = Field(default_factory=dict)
    ledger: dict[str, LedgerEntry] = Field(default_factory=dict)


class SecurityStateError(AgentError):
    """The record is missing or invalid beside a device key: tampered with."""


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


class SecurityState:
    """The security state record of one data dir. ``key`` gives the MAC key (derived from the
    device key, once: see :func:`state_key_provider`)."""

    def __init__(self, data_dir: Path, key: Callable[[], bytes]) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / STATE_FILE
        self._key_source = key
        self._key: bytes | None = None
        self.problem: str | None = None  # set by open(): why the device counts as tampered

    # -- reading and writing ----------------------------------------------------------------------

    def _mac(self, body: bytes) -> str:
        if self._key is None:
            self._key = self._key_source()
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # seeded before the first start
        fd = os.open(self.data_dir / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> SecurityRecord:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raise SecurityStateError(
                f"security state {self.path} is missing beside the device key: its anti-rollback and replay "
                "records may have been deleted; installs, commands and trust updates are refused until it is "
                "re-provisioned (edgesdk fleet reprovision, or edge-agent security-state seed on the device)"
            ) from None
        except OSError as exc:
            raise SecurityStateError(f"security state {self.path} is unreadable: {exc.strerror or exc}") from exc
        try:
            outer = json.loads(raw)
            body = _canonical(outer["record"])
            if not hmac.compare_digest(str(outer["mac"]), self._mac(body)):
                raise ValueError("its MAC does not match (edited, or written with another device key)")
            record = SecurityRecord.model_validate(outer["record"])
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            raise SecurityStateError(
                f"security state {self.path} is not valid ({str(exc).splitlines()[0]}): installs, commands and "
                "trust updates are refused until it is re-provisioned (edgesdk fleet reprovision, or edge-agent "
                "security-state seed on the device)"
            ) from exc
        if record.schema_version != SCHEMA_VERSION:
            raise SecurityStateError(f"security state {self.path} has schema_version {record.schema_version}")
        return record

    def _write(self, record: SecurityRecord) -> None:
        body = record.model_dump(mode="json")
        data = json.dumps({"record": body, "mac": self._mac(_canonical(body))}, indent=1).encode()
        try:
            atomic_write_bytes(self.path, data, mode=0o600)
        except OSError as exc:
            raise AgentError(f"cannot write the security state {self.path}: {exc.strerror or exc}") from exc

    def read(self) -> SecurityRecord:
        """The record as it is on disk now; SecurityStateError when it is missing or invalid."""
        with self._locked():
            return self._read()

    def update(self, change: Callable[[SecurityRecord], SecurityRecord]) -> SecurityRecord:
        """Read, apply ``change``, write back (durable before it returns), under the lock."""
        with self._locked():
            record = change(self._read())
            self._write(record)
            return record

    # -- start and recovery -----------------------------------------------------------------------

    def create(self) -> None:
        """Write a new, empty record: only in the moment a new device key is made (a record of
        an older key, if any, is of another device)."""
        with self._locked():
            self._write(SecurityRecord())
        self.problem = None
        log.info("security state %s created with the device key", self.path)

    def open(self) -> str:
        """Check the record at start: ``"ok"`` or ``"tampered"`` (then :attr:`problem` says why).
        Never creates one (that is :meth:`create`, with the key) and never raises."""
        with self._locked():
            try:
                self._read()
            except SecurityStateError as exc:
                self.problem = str(exc)
                log.error("%s", exc)
                return "tampered"
        self.problem = None
        return "ok"

    def seed(self, record: SecurityRecord, *, replace_valid: bool = False) -> None:
        """Write ``record`` as the device's state (``edge-agent security-state seed``). Refused
        while a valid record exists unless ``replace_valid``."""
        with self._locked():
            if not replace_valid:
                try:
                    self._read()
                except SecurityStateError:
                    pass
                else:
                    raise AgentError(f"security state {self.path} is present and valid; nothing to seed")
            self._write(record)
        self.problem = None

    def status(self) -> dict[str, Any]:
        """For /v1/status."""
        try:
            record = self.read()
        except SecurityStateError as exc:
            return {"path": str(self.path), "tampered": True, "problem": str(exc)}
        return {
            "path": str(self.path),
            "tampered": False,
            "trust_version": record.trust_version,
            "release_floors": dict(record.release_floors),
            "ledger_issuers": len(record.ledger),
        }

    # -- the ports the other parts use ------------------------------------------------------------

    def release_floor(self, model: str) -> ModelFloorRecord:
        """The release floor of ``model`` (for :class:`~edgesdk.agent.rollback_floor.RollbackFloor`)."""
        return ModelFloorRecord(self, model)


class ModelFloorRecord:
    """One model's release floor in the record (the ``RecordedFloor`` port of rollback_floor)."""

    def __init__(self, state: SecurityState, model: str) -> None:
        self.state = state
        self.model = model

    def read(self) -> int | None:
        """The recorded floor (None: this model never committed); SecurityStateError when tampered."""
        return self.state.read().release_floors.get(self.model)

    def write(self, value: int) -> None:
        def change(record: SecurityRecord) -> SecurityRecord:
            return record.model_copy(update={"release_floors": {**record.release_floors, self.model: value}})

        self.state.update(change)


class RecordLedgerStore:
    """The command ledger in the record (the ``LedgerStore`` port of ota/freshness.py)."""

    def __init__(self, state: SecurityState) -> None:
        self.state = state

    def load(self) -> dict[str, tuple[int, str]]:
        return {key: (e.sequence, e.digest) for key, e in self.state.read().ledger.items()}

    def save(self, entries: dict[str, tuple[int, str]]) -> None:
        ledger = {key: LedgerEntry(sequence=seq, digest=digest) for key, (seq, digest) in entries.items()}
        self.state.update(lambda record: record.model_copy(update={"ledger": ledger}))


def state_key_provider(device_key_path: Path, *, unseal: str) -> Callable[[], bytes]:
    """How to get the record's key: from the unseal helper (``unseal = "helper"``, the daemon
    never reads the device key) or in process."""

    def derive() -> bytes:
        if unseal == "in_process":
            from edgesdk.keys import load_device_private_key

            return derive_state_key(load_device_private_key(device_key_path).private_bytes_raw())
        from edgesdk.agent.unseal import Unsealer

        with Unsealer(publisher_keys=[], device_key=device_key_path) as unsealer:
            return unsealer.state_key()

    return derive


def create_with_new_key(data_dir: Path, device_key: Path) -> SecurityState:
    """The empty record of a device key made just now outside the agent (an image build step,
    a test fixture), derived in process: the same step that makes the key makes its record."""
    state = SecurityState(Path(data_dir), state_key_provider(Path(device_key), unseal="in_process"))
    state.create()
    return state


def device_key_path(config: AgentConfig) -> Path:
    """The device key of ``config`` (configured, else ``data_dir/device.key``), as the daemon finds it."""
    return Path(config.device_key) if config.device_key is not None else Path(config.data_dir) / "device.key"


def for_config(config: AgentConfig) -> SecurityState:
    """The security state of ``config``'s data dir, checked (:meth:`SecurityState.open`)."""
    key_path = device_key_path(config)
    if not key_path.exists():
        raise AgentError(f"device key {key_path} not found: start the agent once (or run edge-agent key) first")
    state = SecurityState(Path(config.data_dir), state_key_provider(key_path, unseal=config.unseal))
    state.open()
    return state


def record_from_files(config: AgentConfig, floors: dict[str, int]) -> SecurityRecord:
    """What ``edge-agent security-state seed`` writes: the trust document, each model's floor
    and the command ledger as the data dir's files say now (``floors`` sets or overrides a
    model's floor). AgentError naming a model whose floor the files cannot establish."""
    from edgesdk.agent.installed_models import InstalledModels
    from edgesdk.agent.trust import AgentTrust

    from edgesdk.errors import RollbackFloorUnknownError

    data_dir = Path(config.data_dir)
    trust_text, trust_version = None, None
    if config.trust_document is not None:
        trust = AgentTrust(Path(config.trust_document), data_dir)
        document = trust.verified()  # the installed copy when there is one; its own root checked
        if trust.path != trust.shipped:
            trust_text, trust_version = trust.path.read_text(), document.version
    stores = InstalledModels(data_dir)
    release_floors = dict(floors)
    for name in stores.names():
        if name in floors:
            continue
        try:
            floor = stores.store(name).rollback_floor()
        except RollbackFloorUnknownError as exc:
            raise AgentError(f"{exc}; state the floor with --floor {name}=RELEASE") from exc
        if floor is not None:
            release_floors[name] = floor
    ledger: dict[str, LedgerEntry] = {}
    ledger_path = data_dir / "ota" / "command_sequence.json"
    if ledger_path.exists():
        try:
            issuers = json.loads(ledger_path.read_bytes())["issuers"]
            ledger = {
                str(k): LedgerEntry(sequence=int(v["sequence"]), digest=str(v["digest"])) for k, v in issuers.items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
            raise AgentError(f"command ledger {ledger_path} is unreadable ({exc}); repair or remove it") from exc
    return SecurityRecord(
        trust_document=trust_text, trust_version=trust_version, release_floors=release_floors, ledger=ledger
    )
