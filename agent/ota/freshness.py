"""Fresh, bound commands: the device-side checks a signed deployment passes before it is acted on.

A valid signature says who issued a command, not when or for whom. So, after the signature,
every deployment, cancel and rollback must also be:

* **addressed to this device** — its id in ``targets`` or one of its groups in ``target_groups``
  (a canary's message published on another device's topic is refused);
* **fresh** — ``issued_at`` not further in the future than the clock-skew tolerance, and
  ``expires_at`` not further in the past than it (a command captured today is dead by tonight);
* **bounded** — valid for no longer than ``[ota] max_command_validity_s`` (default a week: a
  command valid until 2121 would stay a weapon in a capture for a century), and its ``sequence``
  no further ahead of the device's clock, read as Unix milliseconds, than the clock-skew
  tolerance plus :data:`SEQUENCE_LEAD_S` (the fleet issues sequences from the time in ms; one
  signed far ahead would be accepted, then make every later command of its key a "replay");
* **new** — its ``sequence`` above the last one accepted from the same signing key. The last
  accepted sequence per key is persisted atomically (write-temp, fsync, rename) *before* the
  command is acted on, so neither a restart nor a crash reopens the window.

One exception keeps QoS 1 honest: the exact last accepted command arriving again (a broker
redelivery, the controller's resend to a device whose status was lost) is a *repeat*, answered
by re-reporting the current state and never acted on a second time.

Each refusal is a :class:`CommandRefused` whose ``why`` names the check (``replay``,
``expired``, ``not_yet_valid``, ``not_addressed``, ``unversioned``, ``validity_too_long``,
``sequence_ahead``); the update manager turns
it into a FAILED ``ota/status`` and an ``ota_refused`` event. See docs/ota.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Literal, Protocol

from edgesdk.agent.ota.record import write_atomically

from edgesdk.errors import AgentError, UpdateError
from edgesdk.schemas.messages import MAX_COMMAND_VALIDITY_S, Deployment

log = logging.getLogger(__name__)

#: Default tolerance between the operator's clock and the device's (AgentConfig.ota.clock_skew_s).
DEFAULT_CLOCK_SKEW_S = 300.0

#: How far, beyond the clock skew, a command's sequence may be ahead of the device's clock in
#: Unix milliseconds. The fleet issues max(time in ms, last + 1) (``next_sequence``), so it runs
#: ahead of its clock only by issuing more than a command per millisecond: an hour is 3.6 million
#: commands ahead. It is also the longest one bad signed sequence can hold the key's later
#: commands back (they are "replays" until the fleet's clock passes it) — where a sequence of
#: 10**30 would have locked the key out for good.
SEQUENCE_LEAD_S = 3600.0

RefusalKind = Literal[
    "replay", "expired", "not_yet_valid", "not_addressed", "unversioned", "validity_too_long", "sequence_ahead"
]


class CommandRefused(UpdateError):
    """A correctly signed command that is replayed, expired, not yet valid, valid for too long,
    numbered too far ahead, or not for this device."""

    def __init__(self, why: RefusalKind, message: str) -> None:
        super().__init__(message)
        self.why: RefusalKind = why


class Admission(Enum):
    """What the manager does with a command that passed the gate."""

    ACT = "act"  #: new: act on it
    REPEAT = "repeat"  #: the exact last accepted command again: re-report, do nothing


@dataclass(frozen=True)
class _Accepted:
    sequence: int
    digest: str  # sha256 of the signature: identifies the exact command (Ed25519 is deterministic)


class LedgerStore(Protocol):
    """Where the ledger lives when not in its own file: the device's security state record
    (:class:`edgesdk.agent.security_state.RecordLedgerStore`). ``load`` raises
    :class:`~edgesdk.errors.AgentError` when the record is missing or invalid (tampered)."""

    def load(self) -> dict[str, tuple[int, str]]: ...

    def save(self, entries: dict[str, tuple[int, str]]) -> None: ...


class SequenceLedger:
    """The last accepted sequence per signing key, in one atomically replaced JSON file, or in
    ``store`` (the agent's authenticated security state, so deleting a file cannot reopen it).

    A ledger that exists but cannot be read fails closed: every command is refused (as a replay
    of an unknown window) until an operator looks — starting from zero would reopen every
    command ever captured."""

    def __init__(self, path: Path, *, store: LedgerStore | None = None) -> None:
        self.path = path
        self.store = store
        self._lock = threading.Lock()
        self._entries: dict[str, _Accepted] | None = None
        self._error: str | None = None

    def _load(self) -> dict[str, _Accepted]:
        if self.store is not None:  # read each time: the record is the authority, never a cache
            try:
                return {key: _Accepted(seq, digest) for key, (seq, digest) in self.store.load().items()}
            except AgentError as exc:
                raise CommandRefused("replay", f"command ledger: {exc}") from exc
        if self._entries is not None:
            return self._entries
        try:
            raw = json.loads(self.path.read_bytes())
            entries = {
                str(key): _Accepted(int(value["sequence"]), str(value["digest"]))
                for key, value in raw["issuers"].items()
            }
        except FileNotFoundError:
            entries = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._error = f"sequence ledger {str(self.path)!r} is unreadable ({exc})"
            log.error("%s; refusing every command until it is repaired", self._error)
            raise CommandRefused("replay", self._error) from exc
        self._entries = entries
        return entries

    def last(self, issuer: str) -> int:
        """The last accepted sequence from ``issuer`` (0 when none)."""
        with self._lock:
            entry = self._load().get(issuer)
            return entry.sequence if entry else 0

    def admit(self, issuer: str, sequence: int, signature: str, *, what: str) -> Admission:
        """Record ``sequence`` as accepted from ``issuer`` (persisted before returning ACT), or
        refuse it; ``what`` names the command in the refusal."""
        digest = hashlib.sha256(signature.encode()).hexdigest()
        with self._lock:
            entries = self._load()
            last = entries.get(issuer)
            if last is not None and sequence == last.sequence and digest == last.digest:
                return Admission.REPEAT
            if last is not None and sequence <= last.sequence:
                raise CommandRefused(
                    "replay",
                    f"replay: {what} has sequence {sequence}, not above the last accepted {last.sequence} "
                    f"from key {issuer}",
                )
            updated = {**entries, issuer: _Accepted(sequence, digest)}
            if self.store is not None:
                self.store.save({key: (e.sequence, e.digest) for key, e in updated.items()})
                return Admission.ACT
            document = {
                "issuers": {key: {"sequence": e.sequence, "digest": e.digest} for key, e in sorted(updated.items())}
            }
            write_atomically(self.path, json.dumps(document, indent=1).encode())
            self._entries = updated
            return Admission.ACT


class CommandGate:
    """The freshness, audience and replay checks of one device (see the module docstring)."""

    def __init__(
        self,
        ledger: SequenceLedger,
        *,
        device_id: str,
        groups: Iterable[str] = (),
        clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
        max_validity_s: float = MAX_COMMAND_VALIDITY_S,
    ) -> None:
        self.ledger = ledger
        self.device_id = device_id
        self.groups = frozenset(groups)
        self.clock_skew = timedelta(seconds=clock_skew_s)
        self.max_validity = timedelta(seconds=max_validity_s)

    def admit(self, command: Deployment, issuer: str, *, now: datetime | None = None) -> Admission:
        """Check ``command`` (whose signature by ``issuer`` was verified); raise CommandRefused."""
        now = now or datetime.now(timezone.utc)
        what = f"{command.action} {command.deployment_id!r}"
        if command.schema_version < 2 or command.expires_at is None or command.sequence is None:
            raise CommandRefused(
                "unversioned",
                f"{what} is schema_version {command.schema_version}: no expiry or sequence; "
                "issue it again with a current edgesdk",
            )
        if self.device_id not in command.targets and not self.groups & set(command.target_groups):
            audience = ", ".join([*command.targets, *(f"group {g}" for g in command.target_groups)])
            raise CommandRefused(
                "not_addressed", f"not addressed to this device ({self.device_id}): {what} is for {audience}"
            )
        if command.issued_at > now + self.clock_skew:
            raise CommandRefused(
                "not_yet_valid",
                f"not yet valid: {what} issued at {command.issued_at.isoformat()}, device time {now.isoformat()} "
                f"(clock skew allowed {self.clock_skew.total_seconds():g} s; is the device clock set?)",
            )
        if command.expires_at < now - self.clock_skew:
            raise CommandRefused(
                "expired",
                f"expired: {what} expired at {command.expires_at.isoformat()}, device time {now.isoformat()} "
                f"(clock skew allowed {self.clock_skew.total_seconds():g} s)",
            )
        validity = command.expires_at - command.issued_at
        if validity > self.max_validity:
            raise CommandRefused(
                "validity_too_long",
                f"validity too long: {what} is valid for {validity.total_seconds():g} s (issued at "
                f"{command.issued_at.isoformat()}, expires at {command.expires_at.isoformat()}); this device "
                f"accepts at most {self.max_validity.total_seconds():g} s ([ota] max_command_validity_s): "
                "issue it with a shorter --expires",
            )
        ceiling = sequence_ceiling(now, self.clock_skew)
        if command.sequence > ceiling:
            raise CommandRefused(
                "sequence_ahead",
                f"sequence ahead of time: {what} has sequence {_quote_number(command.sequence)}, above {ceiling} "
                f"(this device's time in Unix ms, plus the clock skew and {SEQUENCE_LEAD_S:g} s); fleets issue "
                "sequences from their clock in ms: check the issuing machine's clock and its issuers table",
            )
        return self.ledger.admit(issuer, command.sequence, command.signature or "", what=what)


def sequence_ceiling(now: datetime, clock_skew: timedelta) -> int:
    """The highest sequence a device accepts at ``now``: its clock in Unix milliseconds plus the
    clock skew and :data:`SEQUENCE_LEAD_S`."""
    return int((now + clock_skew).timestamp() * 1000 + SEQUENCE_LEAD_S * 1000)


def _quote_number(value: int) -> str:
    """``value`` for a message; one of absurd length (a signed 10**5000, which ``str`` refuses to
    print) as its order of magnitude."""
    return str(value) if value.bit_length() <= 64 else f"about 2**{value.bit_length() - 1}"


class ReportBudget:
    """A token bucket on the ``ota_refused`` events of messages that prove no sender (unparsable,
    unsigned, signed by an unknown key, tampered): anyone who can publish on the device's topic
    can send those, so they must not fill the outbox or crowd out the device's other events.
    ``burst`` events at once, then ``per_minute``; the rest are logged and counted (``suppressed``)."""

    def __init__(self, burst: int = 10, per_minute: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate_s = per_minute / 60.0
        self.suppressed = 0
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """True when one more event may go now."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_s)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            self.suppressed += 1
            return False
