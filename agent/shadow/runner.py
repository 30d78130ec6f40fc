"""The shadow worker: a sampled share of live requests also runs on the previous release, off
the request's thread, and the two answers are compared.

The tap (on ``ModelServer.taps``, called after each answer) only draws a random number and puts
the request's feeds and outputs on a small bounded queue: it never runs a model, never blocks
(a full queue drops the sample and counts it), and does nothing while the governor reports
thermal or power pressure. ONE worker thread, at a lower scheduling priority where the OS lets
us, takes the queue, runs the reference model and records the agreement. A deployment asking
``shadow_rate`` 1.0 on a busy device therefore costs at most one core's worth of reference runs,
never a queue that grows or an answer that waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from edgesdk.agent.shadow.agreement import Agreement

log = logging.getLogger(__name__)

#: Requests waiting for the worker; beyond it, samples are dropped (and counted).
QUEUE_SIZE = 8
#: The worker's nice increment (Linux: per thread), so serving threads win the CPU.
WORKER_NICE = 10

Sample = tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]


class ShadowRunner:
    """Runs sampled requests of ``model_name`` on ``reference`` (a second ModelServer) and tallies agreement."""

    def __init__(
        self,
        model_name: str,
        reference: Any,
        agreement: Agreement,
        *,
        rate: float,
        pressure: Callable[[], str | None] = lambda: None,
        queue_size: int = QUEUE_SIZE,
        draw: Callable[[], float] | None = None,
        minimum: float | None = None,
        runs_candidate: bool = False,
    ) -> None:
        self.model_name = model_name
        # False (probation): ``reference`` is the previous release, the live answers are judged.
        # True (the shadow phase before activation): ``reference`` is the staged model that
        # answers nobody, judged against the live answers of the model that serves.
        self.runs_candidate = runs_candidate
        self.minimum = minimum  # the deployment's min_agreement: telemetry reads the figures against it
        self.reference = reference
        self.agreement = agreement
        self.rate = rate
        self.pressure = pressure
        self._draw = draw or random.Random().random
        self._queue: queue.Queue[Sample] = queue.Queue(maxsize=queue_size)
        self._stopping = threading.Event()
        self._counting = threading.Lock()
        self._quiet: set[int] = set()  # threads whose requests are not live traffic (probation's probes)
        self._thread: threading.Thread | None = None
        self.seen = 0
        self.sampled = 0
        self.dropped = 0  # the queue was full
        self.skipped_pressure = 0
        self.errors = 0  # the reference model failed on a sample
        self.compared = 0

    # -- the tap (request threads) ----------------------------------------------------------------

    def tap(self, model_name: str, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], _: str) -> None:
        """``ModelServer.taps`` entry: sample, then hand over without waiting."""
        if model_name != self.model_name or threading.get_ident() in self._quiet or self._stopping.is_set():
            return
        taken = self.rate > 0 and self._draw() < self.rate
        skipped = taken and self.pressure() is not None
        queued = False
        if taken and not skipped:
            try:
                self._queue.put_nowait((feeds, outputs))
                queued = True
            except queue.Full:
                pass
        with self._counting:  # request threads tap at once: no count may be lost
            self.seen += 1
            self.skipped_pressure += skipped
            self.sampled += queued
            self.dropped += taken and not skipped and not queued

    @contextlib.contextmanager
    def quiet(self) -> Any:
        """Requests made by this thread inside the block (probes) are not sampled."""
        ident = threading.get_ident()
        self._quiet.add(ident)
        try:
            yield
        finally:
            self._quiet.discard(ident)

    # -- the worker -------------------------------------------------------------------------------

    def start(self) -> ShadowRunner:
        self._thread = threading.Thread(target=self._work, name=f"shadow-{self.model_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker (the sample it runs finishes; the rest are dropped) and wait for it."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _work(self) -> None:
        _lower_priority()
        while not self._stopping.is_set():
            try:
                feeds, outputs = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                ran = self.reference.infer(self.model_name, feeds)
            except Exception as exc:  # noqa: BLE001 - a reference failure must never reach serving
                self.errors += 1
                log.debug("shadow reference run failed: %s", exc)
                continue
            if self.runs_candidate:
                self.agreement.compare(ran, outputs)
            else:
                self.agreement.compare(outputs, ran)
            self.compared += 1

    def counts(self) -> str:
        """What the sampler did, for the probation line."""
        parts = [f"{self.compared} compared of {self.seen} requests at rate {self.rate:g}"]
        for label, count in (
            ("dropped (queue full)", self.dropped),
            ("skipped (pressure)", self.skipped_pressure),
            ("reference errors", self.errors),
        ):
            if count:
                parts.append(f"{count} {label}")
        return ", ".join(parts)


def _lower_priority() -> None:
    """Nice this thread (Linux's setpriority takes a thread id); elsewhere nothing."""
    native = getattr(threading, "get_native_id", None)
    if native is None or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, native(), WORKER_NICE)
