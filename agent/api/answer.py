"""What an inference hands back to its transport: an :class:`Answer` (the encoded outputs), or a
``refusal.ErrorAnswer`` (an error). Neither knows HTTP or gRPC: the HTTP adapter (``app.py``) writes
an Answer as a 200 response with its content type and header fields, the gRPC one
(``grpc_server.py``) returns its body as the serialized ``ModelInferResponse``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class Answer:
    """A 200's body, its media type and its further fields (``X-Model-Variant``, ...)."""

    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
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
