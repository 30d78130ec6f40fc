"""The ``X-Tensors`` header of the raw tensor encoding (``application/x-edgesdk-tensors``).

``X-Tensors: image=float32[1,1,8,8]; mask=int64[1,16]`` names the arrays whose little-endian,
C-order bytes make up the body, concatenated in that order. The agent reads it on requests
and writes it on answers; the clients (``edgesdk.client``) do the reverse. One definition for
both sides, so the two cannot drift apart (``docs/agent.md`` documents the format).

Errors are ``ValueError`` with the reason: each side translates them at its boundary (the
agent into a 400, a client into ``AgentRequestError``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

#: The media type of the raw encoding.
RAW = "application/x-edgesdk-tensors"
HEADER = "X-Tensors"
#: The dtypes the header can name (numpy's names).
DTYPES = frozenset({"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"})
#: A dimension longer than this is refused as written (numpy's own limit is 2**63 - 1; a
#: larger one would fail deep inside numpy instead of as the sender's error).
MAX_DIM = (1 << 62) - 1
#: A name the header can carry (no separators, no brackets, no spaces).
NAME = re.compile(r"^[^=;\s\[\]]+$")
_ITEM = re.compile(r"^\s*([^=;\s]+)\s*=\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*$")


class TensorEntry(NamedTuple):
    """One array of the header: its name, little-endian dtype, shape and number of elements."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    elements: int


@functools.lru_cache(maxsize=256)
def describe(name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    """One entry: ``image=float32[1,1,8,8]`` (``shape`` a tuple, as numpy's ``.shape``).

    Cached: the same few outputs every answer, and numpy builds ``dtype.name`` anew each time."""
    return f"{name}={dtype.name}[{','.join(map(str, shape))}]"


def format_header(entries: Iterable[tuple[str, np.dtype[Any], tuple[int, ...]]]) -> str:
    """The whole header value for (name, dtype, shape) entries, in body order."""
    return "; ".join(describe(name, dtype, shape) for name, dtype, shape in entries)


@functools.lru_cache(maxsize=256)
def parse_header(header: str) -> tuple[TensorEntry, ...]:
    """``"a=float32[1,8]; b=int64[1]"`` → its entries; ValueError naming the bad entry.

    Cached: a sender repeats the same header with every message, and parsing it (regex, dtype
    objects) costs as much as a tiny model's whole inference."""
    if not header.strip():
        raise ValueError(f"an empty {HEADER} header; it names the arrays, e.g. '{HEADER}: image=float32[1,1,8,8]'")
    entries = []
    for part in header.split(";"):
        match = _ITEM.match(part)
        if not match:
            raise ValueError(f"{HEADER} entry {part.strip()!r} is not NAME=DTYPE[D1,D2,...]")
        name, dtype, dims = match.groups()
        if dtype not in DTYPES:
            raise ValueError(f"{HEADER} entry {name!r}: unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPES))}")
        digits = [d.strip() for d in dims.split(",") if d.strip()]
        # Checked as text first: int() of thousands of digits is itself refused (or slow).
        if any(len(d) > 19 or int(d) > MAX_DIM for d in digits):
            raise ValueError(f"{HEADER} entry {name!r}: a dimension of [{dims}] is over {MAX_DIM}")
        shape = tuple(int(d) for d in digits)
        entries.append(TensorEntry(name, np.dtype(dtype).newbyteorder("<"), shape, math.prod(shape)))
    return tuple(entries)
