"""BytesBuilder: bytes filled in place (CPython) or through one copy (fallback), same result."""

from __future__ import annotations

import os
import sys

import pytest

from edgesdk.bundle import bytes_buffer
from edgesdk.bundle.bytes_buffer import BytesBuilder, in_place_supported


@pytest.mark.parametrize("size", [0, 1, 2, 4096, 3 * 1024 * 1024 + 5])
def test_builder_returns_exactly_what_was_written(size: int) -> None:
    data = os.urandom(size)
    builder = BytesBuilder(size)
    builder.view[:] = data
    result = builder.finish()
    assert type(result) is bytes and result == data and hash(result) == hash(data)
    with pytest.raises(ValueError):
        builder.view[:1] = b"x"  # released: nothing writes into the bytes once handed out


def test_in_place_on_cpython() -> None:
    assert in_place_supported() is (sys.implementation.name == "cpython")


def test_fallback_gives_the_same_bytes(monkeypatch) -> None:
    monkeypatch.setattr(bytes_buffer, "in_place_supported", lambda: False)
    builder = BytesBuilder(10)
    builder.view[:] = b"0123456789"
    assert builder.finish() == b"0123456789"


def test_small_sizes_never_touch_singletons() -> None:
    builder = BytesBuilder(1)
    builder.view[:] = b"\xff"
    assert builder.finish() == b"\xff" and b"\x00" == bytes(1)
