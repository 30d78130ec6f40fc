"""The ``X-Tensors`` header (``edgesdk/protocol/tensor_header.py``): one definition that the
agent's codec and the clients both use — formatted and parsed back, and refused alike."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.protocol.tensor_header import MAX_DIM, TensorEntry, describe, format_header, parse_header


def test_format_and_parse_round_trip() -> None:
    header = format_header([("image", np.dtype("float32"), (1, 1, 8, 8)), ("mask", np.dtype("int64"), (1, 16))])
    assert header == "image=float32[1,1,8,8]; mask=int64[1,16]"
    assert parse_header(header) == (
        TensorEntry("image", np.dtype("<f4"), (1, 1, 8, 8), 64),
        TensorEntry("mask", np.dtype("<i8"), (1, 16), 16),
    )
    assert parse_header(" s = bool [ ] ") == (TensorEntry("s", np.dtype("bool"), (), 1),)  # a scalar
    assert describe("logits", np.dtype("float32"), (8, 10)) == "logits=float32[8,10]"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("", "empty X-Tensors header"),
        ("image", "is not NAME=DTYPE"),
        ("image=float32", "is not NAME=DTYPE"),
        ("image=complex64[2]", "unknown dtype 'complex64'"),
        (f"image=float32[{MAX_DIM + 1}]", "is over"),
        ("image=float32[" + "9" * 40 + "]", "is over"),
    ],
)
def test_bad_headers_name_the_problem(header: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_header(header)


def test_the_agent_and_the_client_refuse_the_same_header() -> None:
    for module in ("orjson", "httptools"):
        pytest.importorskip(module, reason=f"the agent extra ({module}) is not installed")
    from edgesdk.agent.api.codec import DecodeError, tensor_entries

    from edgesdk.client.wire import _parse_tensors
    from edgesdk.errors import AgentRequestError

    with pytest.raises(DecodeError, match="unknown dtype 'complex64'"):
        tensor_entries("y=complex64[2]")
    with pytest.raises(AgentRequestError, match="unknown dtype 'complex64'"):
        _parse_tensors("y=complex64[2]", bytearray(16))
    ok = "y=float32[2]"
    assert [entry[:3] for entry in tensor_entries(ok)] == [("y", np.dtype("<f4"), (2,))]
    np.testing.assert_array_equal(_parse_tensors(ok, bytearray(np.float32([1, 2]).tobytes()))["y"], [1, 2])
