"""Declared sizes are checked before anything is allocated: every request encoding against the
model's signature and the request's share of the memory budget; and the budget itself."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import numpy as np
import pytest
from edgesdk.agent.api.budget import Allowance, BudgetRefused, InflightBytesBudget
from edgesdk.agent.api.codec import (
    JSON_VALUE_BYTES,
    NPY,
    NPZ,
    RAW,
    DeclaredInputError,
    DecodeError,
    decode_request,
    json_parse_cost,
)
from edgesdk.agent.api.open_inference import decode_infer_request
from edgesdk.agent.tensor_signature import Signature, TensorSlot

from edgesdk.schemas.manifest import TensorSpec

SIGNATURE = Signature(
    [TensorSlot("image", np.dtype("float32"), ("batch", 1, 8, 8))],
    [TensorSlot("logits", np.dtype("float32"), ("batch", 10))],
    allow_nonfinite=False,
)
MiB = 1 << 20


def allowance(cap: int = 4 * MiB, budget: int = 64 * MiB) -> Allowance:
    return Allowance(InflightBytesBudget(budget), cap)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npy_header_only(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    """An .npy header declaring ``shape``, with no data after it (what an attacker sends)."""
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def npz_bomb(rows: int) -> bytes:
    """A real .npz of ``rows`` zero images: a few kB of deflate declaring rows*256 bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("image.npy", "w", force_zip64=True) as member:
            member.write(npy_header_only((rows, 1, 8, 8)))
            zeros = bytes(MiB)
            left = rows * 256
            while left:
                member.write(zeros[: min(left, len(zeros))])
                left -= min(left, len(zeros))
    return buffer.getvalue()


def decode(content_type: str, body: bytes, headers: dict[str, str] | None = None, grant: Allowance | None = None):
    return decode_request(content_type, body, headers or {}, "", SIGNATURE, grant or allowance())


def test_good_requests_decode_in_every_encoding() -> None:
    images = np.arange(2 * 64, dtype=np.float32).reshape(2, 1, 8, 8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, image=images)
    for content_type, body, headers in [
        (NPY, npy_bytes(images), {}),
        (NPY, npy_bytes(np.asfortranarray(images)), {}),
        (NPZ, buffer.getvalue(), {}),
        (RAW, images.tobytes(), {"x-tensors": "image=float32[2,1,8,8]"}),
        ("application/json", json.dumps({"inputs": {"image": images.tolist()}}).encode(), {}),
    ]:
        feeds = decode(content_type, body, headers)
        np.testing.assert_array_equal(feeds["image"], images)


def test_npz_bomb_is_refused_from_its_directory_before_inflating() -> None:
    bomb = npz_bomb(64 * 1024)  # 16 MiB of arrays in a few kB
    assert len(bomb) < 100_000
    grant = allowance(cap=4 * MiB)
    with pytest.raises(BudgetRefused) as refused:
        decode(NPZ, bomb, grant=grant)
    assert refused.value.status == 413 and "input 'image'" in str(refused.value)
    assert grant.budget.used == 0  # nothing was taken for arrays


def test_npz_directory_that_lies_about_the_member_size_is_refused() -> None:
    body = bytearray(npz_bomb(4))
    # Patch the central directory's uncompressed size (offset 24 in a PK\1\2 record) upwards.
    at = body.rindex(b"PK\x01\x02")
    struct.pack_into("<I", body, at + 24, 0xFFFFFFF0)
    with pytest.raises(DecodeError):
        decode(NPZ, bytes(body))


def test_npz_unknown_member_and_wrong_fixed_dimension_are_422_before_inflating() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, other=np.zeros(3, np.float32))
    with pytest.raises(DeclaredInputError, match="unknown input 'other'"):
        decode(NPZ, buffer.getvalue())
    buffer = io.BytesIO()
    np.savez(buffer, image=np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(DeclaredInputError, match="axis 1 must be 1"):
        decode(NPZ, buffer.getvalue())


def test_npy_header_declaring_gigabytes_over_a_short_body() -> None:
    # The array is a view of the body (charged when it arrived): the header must declare
    # exactly what the body holds, so numpy never allocates what the header claims.
    with pytest.raises(DecodeError, match=r"\(4294967296 bytes\), the body holds 256"):
        decode(NPY, npy_header_only((1 << 24, 1, 8, 8)) + bytes(256))
    with pytest.raises(DecodeError, match="the body holds 256"):
        decode(NPY, npy_header_only((4, 1, 8, 8)) + bytes(256))
    with pytest.raises(DeclaredInputError, match="dtype float64, expected float32"):
        decode(NPY, npy_bytes(np.zeros((1, 1, 8, 8))))


def test_npy_object_arrays_are_refused() -> None:
    with pytest.raises(DecodeError, match="objects"):
        decode(NPY, npy_header_only((1, 1, 8, 8), "|O") + bytes(8 * 64))


@pytest.mark.parametrize(
    "header",
    [
        "image=float32[" + "9" * 5000 + ",1,8,8]",  # int() itself refuses this many digits
        "image=float32[18446744073709551616,1,8,8]",  # over numpy's dimension limit
        "image=float32[0,18446744073709551615,8,8]",  # zero elements, one absurd dimension
        "image=float32[4611686018427387904,1,8,8]",  # fits the regex, overflows every size
    ],
)
def test_x_tensors_overflowing_dimensions_are_client_errors(header: str) -> None:
    with pytest.raises((DecodeError, DeclaredInputError)):
        decode(RAW, bytes(256), {"x-tensors": header})


def test_json_lists_are_checked_against_the_signature_and_charged() -> None:
    with pytest.raises(DeclaredInputError, match="axis 1 must be 1"):
        decode("application/json", json.dumps({"inputs": {"image": [[[[0.0] * 8] * 8] * 2]}}).encode())
    # 2048 images: 2 MiB of float32, but ~20 MiB of Python objects while the text is parsed,
    # refused from a count of its commas before parsing.
    rows = [[[[0.0] * 8] * 8]] * 2048
    with pytest.raises(BudgetRefused, match="the JSON body"):
        decode("application/json", json.dumps({"inputs": {"image": rows}}).encode(), grant=allowance(cap=MiB))


def v2_request(shape: list[int], *, binary: int | None = None, data: list[float] | None = None) -> bytes:
    item: dict = {"name": "image", "datatype": "FP32", "shape": shape}
    if binary is not None:
        item["parameters"] = {"binary_data_size": binary}
    else:
        item["data"] = data
    return json.dumps({"inputs": [item]}).encode()


def test_v2_binary_size_must_match_shape_and_dtype() -> None:
    header = v2_request([1, 1, 8, 8], binary=100)
    with pytest.raises(DecodeError, match="binary_data_size 100 does not match"):
        decode_infer_request(
            header + bytes(100), {"inference-header-content-length": str(len(header))}, SIGNATURE, allowance()
        )
    header = v2_request([1 << 40, 1, 8, 8], binary=256)
    with pytest.raises(DecodeError):
        decode_infer_request(
            header + bytes(256), {"inference-header-content-length": str(len(header))}, SIGNATURE, allowance()
        )
    header = v2_request([0, 1 << 62, 8, 8], binary=0)
    with pytest.raises(DeclaredInputError):
        decode_infer_request(header, {"inference-header-content-length": str(len(header))}, SIGNATURE, allowance())


def test_v2_json_data_length_is_checked_against_the_declared_shape_first() -> None:
    with pytest.raises(DecodeError, match="64 values for shape"):
        decode_infer_request(v2_request([1 << 30, 1, 8, 8], data=[0.0] * 64), {}, SIGNATURE, allowance())
    with pytest.raises(DeclaredInputError, match="axis 2 must be 8"):
        decode_infer_request(v2_request([1, 1, 4, 16], data=[0.0] * 64), {}, SIGNATURE, allowance())


def test_the_budget_is_shared_and_given_back() -> None:
    budget = InflightBytesBudget(10 * MiB)
    first, second = Allowance(budget, 8 * MiB), Allowance(budget, 8 * MiB)
    assert first.take_body(6 * MiB)
    assert not second.take_body(6 * MiB)  # the caller answers 503 before reading the body
    first.take_decoded(3 * MiB, "input 'a'")
    with pytest.raises(BudgetRefused) as refused:
        second.take_decoded(2 * MiB, "input 'b'")
    assert refused.value.status == 503 and ("Retry-After", "1") in refused.value.headers
    first.release()
    first.release()  # idempotent
    assert budget.used == 0
    with pytest.raises(BudgetRefused):  # an answered request takes nothing more
        first.take_decoded(1, "input 'a'")
    assert budget.used == 0


def test_json_nested_too_deep_is_a_400_not_a_recursion_error() -> None:
    deep = b'{"inputs": {"image": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with pytest.raises(DecodeError, match="nested too deep"):
        decode("application/json", deep)
    with pytest.raises(DecodeError, match="nested too deep"):
        decode_infer_request(b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, SIGNATURE, allowance())


@pytest.mark.parametrize("values", [3, 5_000, 200_000], ids=["short", "just-over-16k", "3-MB-like"])
def test_json_parse_cost_counts_every_comma_whichever_way_it_counts(values: int) -> None:
    text = json.dumps({"inputs": {"x": [0.5] * values}}).encode()
    assert json_parse_cost(text) == values * JSON_VALUE_BYTES  # values - 1 commas, plus the last value


def test_decoded_json_requests_hold_their_arrays_not_the_parse_cost() -> None:
    images = np.full((4, 1, 8, 8), 0.25, np.float32)
    body = json.dumps({"inputs": {"image": images.tolist()}}).encode()
    grant = allowance()
    feeds = decode_request("application/json", body, {}, "", SIGNATURE, grant)
    np.testing.assert_array_equal(feeds["image"], images)
    # Charged while parsing (checked: a cap below it refuses), held afterwards: the float32 arrays.
    assert grant.held == grant.budget.used == images.nbytes
    assert grant.decoded >= json_parse_cost(body) + images.nbytes
    with pytest.raises(BudgetRefused):
        decode_request("application/json", body, {}, "", SIGNATURE, allowance(cap=json_parse_cost(body) - 1))


def test_npy_headers_remembered_give_what_parsing_gives_and_answers_match_np_save() -> None:
    from edgesdk.agent.api import codec

    signature = Signature.from_specs([([TensorSpec(name="x", dtype="float32", shape=["batch", 4])], [])])
    for rows in (1, 3, 1):  # the second 1-row body is answered from the remembered header
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        buffer = io.BytesIO()
        np.save(buffer, x, allow_pickle=False)
        body = buffer.getvalue()
        (fed,) = codec.decode_request(codec.NPY, body, {}, "", signature).values()
        np.testing.assert_array_equal(fed, x)
        assert body[: len(body) - x.nbytes] in codec._NPY_HEADERS
        encoded, _ = codec.encode_response(codec.NPY, {"y": x}, model="m", version="1", variant="v", query="")
        assert encoded == body  # byte for byte what np.save writes, header built once per shape
    # A remembered header does not make a body of another length pass: it is still checked.
    with pytest.raises(codec.DecodeError, match="the body holds"):
        codec.decode_request(codec.NPY, body + b"\0\0\0\0", {}, "", signature)
    # Nor does a header that fails parsing get remembered.
    bad = b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',"
    with pytest.raises(codec.DecodeError):
        codec.decode_request(codec.NPY, bad, {}, "", signature)
    assert bad[:26] not in codec._NPY_HEADERS
