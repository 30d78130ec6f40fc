"""A route prepared per known header block: a tiny model's inference without its routing.

A keep-alive client repeats one header block with every request (``http.KnownHead``): the same
path, so the same model; the same Content-Type, Accept and query, so the same encodings; for raw
tensors the same X-Tensors, so the same input names, dtypes and shapes; the same Content-Length.
The generic path (``ApiApp.handle`` → ``answer_v1``) works all of that out again for each
request (routing, the model by name, both encodings, the tensor header, the declared shapes
against the signature): ~25 Python calls, more than a tiny model's run (BENCHMARKS.md, issue 15).

Once the generic path has answered a request of such a block 200 on the event loop (a tiny
model, see ``inline_max_ms``), the app prepares a :class:`PreparedInfer` for the block around
the model's :class:`~edgesdk.agent.api.plan.InferencePlan` for that body layout (decoder,
encoder, limits: transport-neutral, ``plan.py``), with all of that resolved. Each later request of the block then does only what depends on its body and
on the moment: admission (capacity, the inline decision, its share of the memory budget), the
body as arrays, the checks that depend on the values (NaN/Inf; for JSON and ``.npy``, whose
shapes are in the body, the whole signature check), the active variant's run, the latency
histogram, the answer. The plan is the block's ``http.InlineRoute``: the HTTP server asks it
before making a Request, so an answered request never has a Request, an Allowance, a
``respond`` callback or a Response (each costs on every answer of a tiny model).

It never answers an error itself. Anything it does not expect (the model swapped, the inline
conditions not met, capacity or the memory budget full, a body that does not decode, NaN/Inf,
a runtime failure) is declined, all it held given back first, and the HTTP server hands the
request to the generic path, which answers it as it always did: same status code, same error
count. So the API behaves as the generic path by construction; the plan only makes the plain
case shorter. (A runtime failure runs the model twice, once here and once to be answered: rare,
and the price of keeping one error path.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
from edgesdk.agent.api.answer import AnswerFields
from edgesdk.agent.api.budget import Allowance
from edgesdk.agent.api.http import KnownHead, Request, head_start
from edgesdk.agent.api.plan import InferencePlan, plan_for

from edgesdk.errors import InferenceInputError

if TYPE_CHECKING:
    from edgesdk.agent.api.app import ApiApp

log = logging.getLogger("edgesdk.agent.api")

#: Where a request taken for a batch gets its answer (``later``): the HTTP connection's.
Reply = Callable[[tuple[bytes, AnswerFields] | None], None]


class PreparedInfer:
    """``POST /v1/models/{name}/infer`` for every request with one header block (see module):
    the block's ``http.InlineRoute``, which the HTTP server asks before it makes a Request."""

    __slots__ = (
        "scheduler",
        "server",
        "model",
        "known",
        "decode",
        "encode",
        "head",
        "budget",
        "max_decoded",
        "hold",
        "allowances",
        "_variant",
        "_ran",
        "_allowance",
        "batching",
        "batch_max",
        "_input",
        "_pending",
        "_company",
        "_probe_left",
        "_probes",
        "_served",
    )

    def __init__(self, app: ApiApp, plan: InferencePlan, known: KnownHead, limits: Allowance) -> None:
        self.scheduler = app.scheduler
        self.server = app.server
        # The plan's, copied into this route's slots: read on every answer, one lookup each.
        # (The model weakly: a block nobody sends again keeps its route, and an update's
        # previous model, its runtime sessions, tens of MB, must not stay in memory for it.)
        self.model = plan.model
        self.known = known
        self.decode = plan.decode
        self.encode = plan.encode
        self.head = head_start(200, plan.content_type)
        # The HTTP server's memory budget and per-request cap (those of the request it was
        # prepared from): a request it answers holds its share of that budget itself.
        self.budget = limits.budget
        self.max_decoded = limits.max_decoded
        self.hold = plan.hold
        self.allowances = plan.allowances
        batch_input = plan.batch_input
        # The request being answered, from ``answer`` to ``answered`` (one at a time: both run
        # on the event loop, back to back, around the HTTP server's write).
        self._variant = ""
        self._ran = 0.0
        self._allowance: Allowance | None = None
        # Batches of the requests one wake-up of the loop brings (``later``): the model's one
        # input, when it has a batch axis and the API allows batches (inline_batch_max > 1).
        self.batching = batch_input is not None
        self.batch_max = app.scheduler.inline_batch_max
        self._input = batch_input or ""
        #: (its reply, its input array, its Allowance) of the requests taken for the next batch.
        self._pending: list[tuple[Reply, np.ndarray, Allowance | None]] = []
        self._company = 0  # requests in the last batch
        self._probe_left = _PROBE_EVERY
        self._probes = 0
        #: (model name, feeds, outputs) of the request being answered, kept only while the
        #: server has taps (``ModelServer.taps``), for ``answered`` to hand them.
        self._served: tuple[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None

    def answer(self, body: bytes) -> tuple[bytes, AnswerFields] | None:
        scheduler = self.scheduler
        model = self.model()
        # Swapped or unloaded: the generic path answers, and prepares again for what serves now.
        if model is None or self.server.model is not model:
            self.known.route = None
            self.known.settled = False
            return None
        requests = scheduler.requests
        if requests.count >= scheduler.capacity or not scheduler.inline_left:
            return None  # a 503, or the pool: the generic path decides
        budget, hold = self.budget, self.hold
        with budget.lock:  # Allowance.take_body, written out (the generic path answers a 503)
            if budget.used + hold > budget.capacity:
                return None
            budget.used += hold
        allowance = Allowance(budget, self.max_decoded) if self.allowances else None
        requests.count += 1
        try:
            feeds = self.decode(body, allowance)
            variant = model.active  # taken once: this request finishes on this variant
            run = variant.loaded.run if variant.takes_public_feeds else variant.run
            started = perf_counter()
            outputs = run(feeds)
            ran = perf_counter() - started
            answer = self.encode(outputs, variant.id)
        except Exception as exc:  # noqa: BLE001 - every error is the generic path's to answer (see module)
            log.debug("prepared route: %s goes to the generic path (%r)", self.known.path, exc)
            # All back: the generic path takes its own share, within the same limits.
            self._finish(allowance)
            return None
        self._variant, self._ran, self._allowance = variant.id, ran, allowance
        if self.server.taps:
            self._served = (model.name, feeds, outputs)
        return answer

    def answered(self) -> None:
        """Once the answer is on its way: what the client need not wait for."""
        allowance, self._allowance = self._allowance, None
        self._finish(allowance)
        ran = self._ran
        self.server.observe(self._variant, ran)
        # The run's time stands for the whole answer's in the inline decision: what the plan
        # adds is a few microseconds for the small bodies it takes (the generic path times both).
        self.scheduler.took(ran)
        served = self._served
        if served is not None:
            self._served = None
            self.server.tap(*served, self._variant)

    def later(self, body: bytes, reply: Reply) -> bool:
        """Take this request for a batch with the others this wake-up of the loop brings (from
        other connections: each sends one request at a time), run once their reads are done
        (``_run_batch``, next on the loop), or False: ``answer`` answers it now.

        A batch runs only when it may have company: the first request of a wake-up is taken
        when the last batch had two or more, and, after a batch ran alone, every
        ``_PROBE_EVERY``-th request or so (clients come and go); else it is answered at once, as
        without batching (a lone request waiting for nobody would only lose the loop's turn).
        A request taken holds what ``answer`` would (its count, its memory share) and has been
        decoded and checked; a body that does not decode is left to ``answer``, which declines
        it as always."""
        pending = self._pending
        if not pending:
            if self._company < 2:
                self._probe_left -= 1
                if self._probe_left > 0:
                    return False
                # The period varies (16-22): a fixed one could keep landing on the last read of
                # each wake-up (a client pattern of that period), which finds no company.
                self._probes += 1
                self._probe_left = _PROBE_EVERY + self._probes % 7
        elif len(pending) >= self.batch_max:
            return False
        scheduler = self.scheduler
        model = self.model()
        if model is None or self.server.model is not model:
            return False  # answer() unsettles the block
        requests = scheduler.requests
        if requests.count >= scheduler.capacity or not scheduler.inline_left:
            return False
        budget, hold = self.budget, self.hold
        with budget.lock:
            if budget.used + hold > budget.capacity:
                return False
            budget.used += hold
        allowance = Allowance(budget, self.max_decoded) if self.allowances else None
        requests.count += 1
        try:
            feed = self.decode(body, allowance)[self._input]
        except Exception as exc:  # noqa: BLE001 - answer() meets it again and hands it to the generic path
            log.debug("prepared route: %s not taken for a batch (%r)", self.known.path, exc)
            self._finish(allowance)
            return False
        pending.append((reply, feed, allowance))
        if len(pending) == 1:
            self.scheduler.loop.call_soon(self._run_batch)  # type: ignore[union-attr]  # set before serving
        return True

    def _run_batch(self) -> None:
        """The requests ``later`` took: one run of their inputs stacked on the batch axis (the
        active variant taken once), each answered its rows of every output, encoded as
        ``answer`` encodes. Anything unexpected (the model swapped, a runtime error, outputs
        that are not one row per input row) declines them all to the generic path, each
        answered alone there as without batching (so is a batch whose stacked inputs do not fit
        the memory budget); an error of a batch's run also turns this plan's batches off."""
        pending, self._pending = self._pending, []
        count = len(pending)
        self._company = count
        answers: list[tuple[bytes, AnswerFields] | None] = [None] * count
        members: list[Mapping[str, np.ndarray]] = []  # each request's rows of the outputs
        variant_id, ran = "", 0.0
        model = self.model()
        arrays = [member[1] for member in pending]
        budget = self.budget
        # The stacked copy of the inputs is memory of its own (a raw body's input is a view of
        # the body, held already): charged while the batch runs, or the batch is declined.
        stack = sum(array.nbytes for array in arrays) if count > 1 else 0
        with budget.lock:
            fits = budget.used + stack <= budget.capacity
            if fits:
                budget.used += stack
        if fits and model is not None and self.server.model is model:
            try:
                variant = model.active
                run = variant.loaded.run if variant.takes_public_feeds else variant.run
                stacked = arrays[0] if count == 1 else np.concatenate(arrays)
                started = perf_counter()
                outputs = run({self._input: stacked})
                ran = perf_counter() - started
                if count == 1:
                    answers[0] = self.encode(outputs, variant.id)
                    members.append(outputs)
                else:
                    rows = len(stacked)
                    if any(output.ndim == 0 or output.shape[0] != rows for output in outputs.values()):
                        raise InferenceInputError("outputs not one row per input row")
                    at = 0
                    for index, array in enumerate(arrays):
                        end = at + len(array)
                        rows_of = {k: v[at:end] for k, v in outputs.items()}
                        answers[index] = self.encode(rows_of, variant.id)
                        members.append(rows_of)
                        at = end
                variant_id = variant.id
            except Exception as exc:  # noqa: BLE001 - every error is the generic path's to answer (see module)
                # The inputs were checked one by one: what fails here is the batch itself (outputs
                # without a batch axis after all, a runtime that cannot take this batch size), so
                # this plan runs every request alone from now on (a model swapped in prepares anew).
                if count > 1:
                    self.batching = False
                    log.info("prepared route for %s: batches off (%r)", self.known.path, exc)
                answers = [None] * count
                variant_id = ""
        if fits:
            with budget.lock:
                budget.used -= stack
        for (reply, _, allowance), answer in zip(pending, answers, strict=True):
            self._finish(allowance)
            try:
                reply(answer)
            except Exception:  # noqa: BLE001 - one broken connection must not keep the others waiting
                log.exception("answering a batched request failed")
        if variant_id:
            observe = self.server.observe
            for _ in range(count):
                observe(variant_id, ran)
            if count > 1:
                self.scheduler.metrics.inline_batched += count
            self.scheduler.took(ran / count)  # the loop was blocked for all of them: its share each
            if self.server.taps and model is not None:
                tap, name, feed_name = self.server.tap, model.name, self._input
                for (_, array, _), outputs_of in zip(pending, members, strict=True):
                    tap(name, {feed_name: array}, outputs_of, variant_id)

    def _finish(self, allowance: Allowance | None) -> None:
        """A request (holding ``allowance``) no longer counts, nor holds its memory."""
        self.scheduler.requests.count -= 1
        budget = self.budget
        with budget.lock:
            budget.used -= self.hold
        if allowance is not None:
            allowance.release()


def prepare(app: ApiApp, request: Request, model_name: str, content_type: str, encoding: str) -> PreparedInfer | None:
    """The route for the requests with ``request``'s header block, which the generic path has
    just answered 200 inline with these encodings (so its body, of the block's Content-Length, is
    small enough to be answered inline), around the model's plan for that layout
    (``plan.plan_for``); None when the block cannot have one (another model than the main one,
    dynamic batching, no body, a layout without a plan)."""
    model = app.server.model
    scheduler = app.scheduler
    if (
        model is None
        or model.name != model_name
        or model.batcher is not None
        or not scheduler.inline_beside_others
        or request.allowance is None
        or request.known is None
        or not request.body
    ):
        return None
    plan = plan_for(
        model,
        content_type,
        encoding,
        query=request.query,
        tensors_header=request.headers.get("x-tensors", ""),
        length=len(request.body),
        max_decoded=request.allowance.max_decoded,
        batch_max=scheduler.inline_batch_max,
    )
    return None if plan is None else PreparedInfer(app, plan, request.known, request.allowance)


#: After a batch ran alone, one request in this many is taken for a batch (``PreparedInfer.later``).
_PROBE_EVERY = 16
