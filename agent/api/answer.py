"""What an inference hands back to its transport: an :class:`Answer` (the encoded outputs), or a
``refusal.ErrorAnswer`` (an error). Neither knows HTTP or gRPC: the HTTP adapter (``app.py``) writes
an Answer as a 200 response with its content type and its :class:`AnswerFields` as header
fields, the gRPC one (``grpc_server.py``) returns its body as the serialized ``ModelInferResponse``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


class AnswerFields:
    """What an answer says beside its body, named by what it means; each transport spells it its
    own way (the HTTP adapter as header fields: ``http.field_lines``). ``lasting``: made once and
    handed with many answers (a plan's, per variant and output layout), so a transport may
    remember what it makes of it; compared and hashed by identity, a dictionary key for that."""

    __slots__ = ("variant", "tensors", "json_length", "lasting")

    def __init__(
        self, variant: str, *, tensors: str | None = None, json_length: int | None = None, lasting: bool = False
    ) -> None:
        #: The id of the variant that answered.
        self.variant = variant
        #: Raw tensors: the outputs' layout, as ``protocol.tensor_header`` writes it.
        self.tensors = tensors
        #: The Open Inference binary extension: the length of the JSON part before the outputs' bytes.
        self.json_length = json_length
        self.lasting = lasting


@dataclass(slots=True)
class Answer:
    """A 200's body, its media type and its further fields (:class:`AnswerFields`; ``headers``:
    fields a route spells itself, ``/predict``'s)."""

    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    fields: AnswerFields | None = None
    #: (model name, feeds, outputs, variant id), set only while the server has taps
    #: (``ModelServer.taps``): the scheduler calls them once the answer is handed over.
    served: tuple[str, Any, Any, str] | None = None


def _jsonable(value: Any) -> Any:
    # What orjson does not serialize itself: numpy arrays it refuses (not C-contiguous, a dtype
    # it lacks), numpy scalars and the like; anything else fails as the stdlib json would.
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: ``dumps(payload)``: JSON text of an API document, numpy arrays natively (float32 stays
#: float32). A partial, not a function: no Python frame for each answer.
dumps: Callable[[Any], bytes] = functools.partial(
    orjson.dumps, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=_jsonable
)


def json_answer(payload: Any, headers: list[tuple[str, str]] | None = None) -> Answer:
    """A JSON answer (the API's default)."""
    return Answer(dumps(payload), headers=headers or [])
