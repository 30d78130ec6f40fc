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
from edgesdk.agent.batching import Member

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
        "_input",
        "_on_batch",
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
        # The request being answered, from ``answer`` to ``answered`` (one at a time: both run
        # on the event loop, back to back, around the HTTP server's write).
        self._variant = ""
        self._ran = 0.0
        self._allowance: Allowance | None = None
        # Batches of the requests one wake-up of the loop brings (``later``, the model's batch
        # former): when it has a batch axis and the API allows batches (inline_batch_max > 1).
        self.batching = plan.batch_input is not None
        self._input = plan.batch_input or ""
        self._on_batch = self._batched  # one object for every request: the former calls it once per batch
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
        """Take this request into the batch the model's former (``agent/batching.py``) forms from
        the requests this wake-up of the loop brings (from other connections: each sends one
        request at a time), run once their reads are done, each answered by ``_batched``; or
        False: ``answer`` answers it now (the former expects no company, the batch is full).
        A request taken holds what ``answer`` would (its count, its memory share) and has been
        decoded and checked; a body that does not decode is left to ``answer``, which declines
        it as always."""
        scheduler = self.scheduler
        model = self.model()
        if model is None or self.server.model is not model:
            return False  # answer() unsettles the block
        former = model.former
        if former is None or not former.splittable:
            self.batching = False  # outputs without a row per input row: never again
            return False
        if not (former.forming or former.company > 1 or former.probe()):
            return False
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
            feeds = self.decode(body, allowance)
        except Exception as exc:  # noqa: BLE001 - answer() meets it again and hands it to the generic path
            log.debug("prepared route: %s not taken for a batch (%r)", self.known.path, exc)
            self._finish(allowance)
            return False
        array = feeds[self._input]  # the plan's one input: its name is the batch's key (see join)
        context = (reply, allowance, model)
        if scheduler.batch(former, self._input, feeds, len(array), array.nbytes, self._on_batch, context, budget):
            return True
        self._finish(allowance)
        return False

    def _batched(self, members: list[Member]) -> None:
        """The requests ``later`` took, once their batch ran: each answered its rows of every
        output, encoded as ``answer`` encodes. Anything unexpected (the model swapped meanwhile,
        an error of the batch's run) declines a request to the generic path, answered alone there
        as without batching; an error of a batch of several also turns this route's batches off
        (a runtime that cannot take this batch size)."""
        server, scheduler = self.server, self.scheduler
        encode, observe, taps = self.encode, server.observe, server.taps
        ran, company = members[0].ran, members[0].company
        answered = 0
        for member in members:
            reply, allowance, model = member.context
            answer = None
            outputs = member.outputs
            if member.error is None and outputs is not None and server.model is model:
                try:
                    answer = encode(outputs, member.tag)
                except Exception as exc:  # noqa: BLE001 - the generic path answers it (see module)
                    log.debug("prepared route: %s batched answer declined (%r)", self.known.path, exc)
            elif member.error is not None and company > 1 and self.batching:
                self.batching = False
                log.info("prepared route for %s: batches off (%r)", self.known.path, member.error)
            self._finish(allowance)
            try:
                reply(answer)
            except Exception:  # noqa: BLE001 - one broken connection must not keep the others waiting
                log.exception("answering a batched request failed")
            if answer is None or outputs is None:
                continue
            answered += 1
            observe(member.tag, member.ran)
            if taps:
                server.tap(model.name, member.feeds, outputs, member.tag)
        if answered:
            if company > 1:
                scheduler.metrics.inline_batched += answered
            scheduler.took(ran / company)  # the loop was blocked for all of them: its share each

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
        or (model.former is not None and model.former.pooled)
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
