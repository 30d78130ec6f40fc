"""The memory the local API may hold for requests, shared by all connections.

Why: a request's cost in memory is its body plus the arrays decoded from it, and an encoding
can declare far more array bytes than it weighs (an ``.npz`` of zeros, an ``.npy`` header over
a short body). The sizes are checked where they are DECLARED (zip directory, ``.npy`` header,
X-Tensors, JSON list lengths, v2 ``binary_data_size``) against the model's signature and
against this budget, and refused before anything is allocated:

* :class:`InflightBytesBudget` — one per server: ``max_inflight_bytes`` of bodies being read or
  waiting plus arrays being decoded, across every connection. A body that would not fit is
  answered 503 with ``Retry-After`` before it is read (its ``Content-Length`` is known first).
  It is then charged by the bytes that arrive, read by read, never by the size it declares:
  a declared size is only a client's word, and nine clients declaring 16 MB each and sending
  a byte a second held the whole budget while sending nothing (issue 37, finding 6). A read
  that no longer fits is a 503 for its request, and what that request held is given back;
* :class:`Allowance` — one per request with a body: what it holds of the budget, and its own
  cap on decoded arrays (``max_decoded_bytes``, 413 over it: retrying would not help). The HTTP
  server releases it when the request is answered or its connection is lost.
"""

from __future__ import annotations

import threading

from edgesdk.errors import AgentError


class BudgetRefused(AgentError):
    """A request refused for its size: 413 (too large for one request) or 503 (the server's
    budget is full now; ``retry_after`` seconds)."""

    public = True

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.http_status = status
        self.retry_after = retry_after
        # The memory budget full now (503: retry) or a request too large for it (413, and the
        # statuses /predict's pipeline refuses with).
        self.grpc_status = "UNAVAILABLE" if status == 503 else "RESOURCE_EXHAUSTED"
        self.error_kind = self.kind_of(status)

    @staticmethod
    def kind_of(status: int) -> str:
        """The error count's kind of a refusal for size with ``status`` (also the HTTP server's,
        which refuses a body on its head before any handler: ``HttpServer.count_error``)."""
        return "overload" if status == 503 else "bad_request"

    @property
    def status(self) -> int:
        return self.http_status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [("Retry-After", str(self.retry_after))] if self.retry_after is not None else []


class InflightBytesBudget:
    """Bytes held for requests, process-wide. Thread-safe: bodies are counted on the event loop,
    decoded arrays in the inference pool."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.refused = 0
        self.lock = threading.Lock()

    def try_take(self, size: int) -> bool:
        with self.lock:
            if self.used + size > self.capacity:
                self.refused += 1
                return False
            self.used += size
            return True

    def give_back(self, size: int) -> None:
        with self.lock:
            self.used -= size

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes would fit now (nothing is taken: a declared body size)."""
        if self.used + size > self.capacity:
            self.refused += 1
            return False
        return True


class Allowance:
    """One request's share of the budget: its body, then the arrays decoded from it."""

    __slots__ = ("budget", "max_decoded", "held", "decoded", "released")

    def __init__(self, budget: InflightBytesBudget, max_decoded: int) -> None:
        self.budget = budget
        self.max_decoded = max_decoded
        self.held = 0
        self.decoded = 0
        self.released = False

    def take_body(self, size: int) -> bool:
        """Hold ``size`` more body bytes, ones that have arrived; False when the budget is full
        (the caller answers 503)."""
        budget = self.budget
        with budget.lock:  # InflightBytesBudget.try_take, written out: once per read of a body
            if budget.used + size > budget.capacity:
                budget.refused += 1
                return False
            budget.used += size
        self.held += size
        return True

    def take_decoded(self, size: int, what: str) -> None:
        """Hold ``size`` bytes of arrays about to be allocated for ``what`` (an input), or raise
        BudgetRefused: 413 over the per-request cap, 503 when the server's budget is full."""
        if self.decoded + size > self.max_decoded:
            raise BudgetRefused(
                413,
                f"{what}: needs {self.decoded + size} bytes of memory for this request; "
                f"the limit is {self.max_decoded} bytes (api.max_decoded_bytes)",
            )
        budget = self.budget
        with budget.lock:
            # A request answered already (504 after request_timeout_s) holds nothing any more:
            # the worker still decoding it must not take bytes nobody would give back.
            if self.released or budget.used + size > budget.capacity:
                budget.refused += 1
                raise BudgetRefused(
                    503, f"{what}: the agent's memory budget for requests is in use; retry shortly", retry_after=1
                )
            budget.used += size
            self.held += size
            self.decoded += size

    def give_back(self, size: int) -> None:
        """Return ``size`` bytes taken with ``take_decoded`` that are garbage now (a parsed
        document once its arrays are built). The per-request cap still counts them: it bounds
        what one request allocates in all."""
        budget = self.budget
        with budget.lock:
            if not self.released:
                size = min(size, self.held)
                budget.used -= size
                self.held -= size

    def refund(self, size: int) -> None:
        """Return ``size`` bytes taken for a reading that was abandoned before it built anything
        that stays (another reading of the same body follows, and charges its own): back to the
        budget and off the per-request cap, as if never taken."""
        self.give_back(size)
        self.decoded -= size

    def release(self) -> None:
        """Give everything back (idempotent)."""
        budget = self.budget
        with budget.lock:
            if not self.released:
                self.released = True
                budget.used -= self.held
                self.held = 0


def unlimited_allowance() -> Allowance:
    """For decoding outside the server (tests, tools): no shared budget, no cap."""
    return Allowance(InflightBytesBudget(1 << 62), 1 << 62)
