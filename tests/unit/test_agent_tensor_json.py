"""The simdjson road for large JSON tensors (agent/api/tensor_json.py): every body answered
exactly as the orjson road answers it (the same array bit for bit, or the same error), the
memory charge held and given back as that road's, and no body touching more memory than
``parse_cost`` charged for it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.api import codec, tensor_json
from edgesdk.agent.api.budget import Allowance, InflightBytesBudget
from edgesdk.agent.api.codec import decode_json
from edgesdk.agent.tensor_signature import Signature, TensorSlot

pytestmark = pytest.mark.skipif(not tensor_json.AVAILABLE, reason="pysimdjson (the agent extra) is not installed")


def signature(dtype: str = "float32", shape: tuple[Any, ...] = ("batch", 2, 4)) -> Signature:
    return Signature(
        [TensorSlot("image", np.dtype(dtype), shape)],
        [TensorSlot("logits", np.dtype("float32"), ("batch", 2))],
        allow_nonfinite=False,
    )


def body(value: Any, **extra: Any) -> bytes:
    return json.dumps({"inputs": {"image": value}, **extra}).encode()


def allowance() -> Allowance:
    return Allowance(InflightBytesBudget(1 << 40), 1 << 40)


def read_both_ways(
    text: bytes, model: Signature, monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[Any, Allowance], tuple[Any, Allowance]]:
    """(what decode_json answers with the simdjson road open for any size, with it closed):
    each an array (or the error's type and text) and the request's allowance afterwards."""
    answers = []
    for available in (True, False):
        monkeypatch.setattr(tensor_json, "AVAILABLE", available)
        monkeypatch.setattr(tensor_json, "MIN_BODY_BYTES", 0)
        held = allowance()
        try:
            with np.errstate(over="ignore"):
                answer: Any = decode_json(text, model, held)["image"]
        except Exception as exc:  # noqa: BLE001 - the error is what is compared
            answer = (type(exc), str(exc))
        answers.append((answer, held))
    return answers[0], answers[1]


def assert_same(first: Any, second: Any) -> None:
    if isinstance(second, np.ndarray):
        assert isinstance(first, np.ndarray), first
        assert first.dtype == second.dtype and first.shape == second.shape
        assert first.tobytes() == second.tobytes()  # bit for bit: -0.0 and rounding included
    else:
        assert first == second


ROWS = [
    [0.1, -2.5, 3e-41, 1e38],
    [1, 2, 3, -4],
    [-0.0, 0.0, 16777217, 2**40],
    [0.30000000000000004, 1 / 3, 2.0**-149, 123456789.123456789],
    [2**53 + 1, -(2**63), 2**63 - 1, 5e-324],
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("row", ROWS)
def test_numbers_are_read_bit_for_bit_as_the_orjson_road_reads_them(
    row: list[Any], dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = body([[row, row[::-1]]])
    (simd, simd_held), (plain, plain_held) = read_both_ways(text, signature(dtype), monkeypatch)
    assert_same(simd, plain)
    # The array stays charged until the answer, the parse given back, on both roads.
    assert simd_held.held == plain_held.held == simd.nbytes


@pytest.mark.parametrize(
    "text",
    [
        body([[[1, 2, 3, 4], [5, 6, 7, [8]]]]),  # a list where a number goes, same count of numbers
        body([[[1, 2, 3, 4], [5, 6, 7, []]]]),
        body([[[1, 2], [3, 4, 5, 6, 7, 8]]]),  # ragged, same count
        body([[[1, 2, 3, 4], [5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8, 9]]]),
        body([[[1, 2, 3, 4], 5]]),
        body([]),
        body([[]]),
        body([[[1, 2, 3, 4], [5, 6, 7, None]]]),
        body([[[1, 2, 3, 4], [5, 6, 7, True]]]),
        body([[[1, 2, 3, 4], [5, 6, 7, "8"]]]),
        body([[[1, 2, 3, 4], [5, 6, 7, {}]]]),
        body([[[1, 2, 3, 4], [5, 6, 7, float("nan")]]]),  # NaN, as Python's json writes it
        body([[[1, 2, 3, 4], [5, 6, 7, float("inf")]]]),
        body([[[1, 2, 3, 4], [5, 6, 7, 1e39]]]),  # float32's Inf
        body([[[1, 2, 3, 4], [5, 6, 7, 2**64]]]),  # past 64 bits: orjson's road reads it slowly
        body([[[1, 2, 3, 4], [5, 6, 7, 8]]], note="x"),  # another member
        body([[[1, 2, 3, 4], [5, 6, 7, 8]]]).replace(b"image", b"other"),
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 8]]], "image": [[[8, 7, 6, 5], [4, 3, 2, 1]]]}}',
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 8]]]}, "inputs": {"image": [[[0, 0, 0, 0], [0, 0, 0, 0]]]}}',
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 8]]]}}  \n',
        b'{\n  "inputs": {\n    "image": [\n      [[1,2,3,4],\n       [5,6,7,8]]\n    ]\n  }\n}',
        b'{"inputs": {"image": [[[1E5, -0, 0.0e-0, 1e+2], [5, 6, 7, 8]]]}}',
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 8]]]}',  # truncated
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 08]]]}}',  # not JSON
        b'{"inputs": {"image": [[[1, 2, 3, 4], [5, 6, 7, 8,]]]}}',
        b'{"inputs": [[[1, 2, 3, 4], [5, 6, 7, 8]]]}',
        b"[[[1, 2, 3, 4], [5, 6, 7, 8]]]",
    ],
)
def test_every_other_body_gets_the_orjson_roads_answer_and_charge(text: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    (simd, simd_held), (plain, plain_held) = read_both_ways(text, signature(), monkeypatch)
    assert_same(simd, plain)
    if isinstance(plain, np.ndarray):  # read by both (whitespace, number forms): the array stays charged
        assert simd_held.held == plain_held.held == plain.nbytes
    else:
        # What the simdjson road took before it gave the body up is refunded: the request
        # holds, and its cap counts, what the orjson road's reading left, nothing more.
        assert (simd_held.held, simd_held.decoded) == (plain_held.held, plain_held.decoded)


@pytest.mark.parametrize(
    "text",
    [
        body([[[1, 2, 3, 4]]]),  # the declared shape's axis 1 is 2
        body([[1, 2, 3, 4]]),  # rank 2, not 3
    ],
)
def test_a_shape_the_model_does_not_take_gets_the_same_error(text: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    (simd, _), (plain, _) = read_both_ways(text, signature(), monkeypatch)
    assert plain[0] is codec.DeclaredInputError
    assert_same(simd, plain)


def _random_tensor(rng: random.Random, depth: int) -> Any:
    """Mostly rectangular lists of numbers, now and then broken the ways a client breaks them."""
    if depth == 3:
        return (
            rng.choice([rng.random(), rng.randint(-9, 9), -0.0])
            if rng.random() > 0.02
            else rng.choice([None, True, "1", [1], [], {}, 1e39])
        )
    size = rng.choice([2, 2, 2, 4, 1, 3]) if depth else 1
    width = {1: 2, 2: 4}.get(depth, size)
    if rng.random() < 0.03:
        width += rng.choice([-1, 1])
    return [_random_tensor(rng, depth + 1) for _ in range(max(width, 0))]


def test_random_tensors_are_answered_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(15)
    read = tensor_json.read_tensor
    answered: list[bool] = []  # by the simdjson road
    monkeypatch.setattr(
        tensor_json, "read_tensor", lambda *args: answered.append((feed := read(*args)) is not None) or feed
    )
    taken = 0
    for _ in range(300):
        text = body(_random_tensor(rng, 0))
        (simd, simd_held), (plain, plain_held) = read_both_ways(text, signature(), monkeypatch)
        assert_same(simd, plain)
        if isinstance(plain, np.ndarray):
            assert simd_held.held == plain_held.held
        taken += isinstance(plain, np.ndarray)
    assert 50 < taken < 300  # both kinds of body were tried
    assert 50 < sum(answered) < len(answered)  # and both roads


def test_a_large_body_takes_the_simdjson_road(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    text = json.dumps({"inputs": {"input": x.tolist()}}).encode()
    assert len(text) >= tensor_json.MIN_BODY_BYTES
    model = Signature([TensorSlot("input", np.dtype("float32"), (1, 3, 64, 64))], [], allow_nonfinite=False)

    def no_orjson(text: bytes) -> Any:
        raise AssertionError("the orjson road read a body the simdjson road answers")

    monkeypatch.setattr(codec, "_parse_json", no_orjson)
    fed = decode_json(text, model, allowance())["input"]
    assert fed.dtype == np.float32 and np.array_equal(fed, x)


def test_a_body_over_the_requests_cap_on_this_road_takes_the_orjson_road(monkeypatch: pytest.MonkeyPatch) -> None:
    """simdjson's charge (~4x the body) is larger than orjson's (~2x): a cap between the two
    must not turn a request the agent answered into a 413."""
    x = np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32)
    text = json.dumps({"inputs": {"input": x.tolist()}}).encode()
    model = Signature([TensorSlot("input", np.dtype("float32"), (1, 3, 64, 64))], [], allow_nonfinite=False)
    cost, _, _ = tensor_json.parse_cost(text, text.index(b"[") - 2)
    held = Allowance(InflightBytesBudget(1 << 40), cost - 1)
    seen: list[int] = []
    reading = codec._parse_json
    monkeypatch.setattr(codec, "_parse_json", lambda text: seen.append(len(text)) or reading(text))
    fed = decode_json(text, model, held)["input"]
    assert seen == [len(text)] and np.array_equal(fed, x)
    assert held.held == fed.nbytes


# Bodies written to make simdjson touch as much memory as it can for their size: each in a
# fresh interpreter, its peak resident memory while parsing compared with the charge.
_WORST_BODIES = {
    "MobileNetV2 as json.dumps writes it": "json.dumps({'inputs': {'input': np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32).tolist()}}).encode()",
    "dense zeros": "b'{\"inputs\": {\"input\": [' + b'0,' * 1_500_000 + b'0]}}'",
    "zeros apart (stage 1 only)": "b'{\"inputs\": {\"input\": [' + b'0 ' * 1_500_000 + b'0]}}'",
    "empty lists": "b'{\"inputs\": {\"input\": [' + b'[],' * 1_000_000 + b'[]]}}'",
    "deep lists": "b'{\"inputs\": {\"input\": ' + b'[' * 3_000_000 + b'}}'",
    "closing brackets": "b'{\"inputs\": {\"input\": ' + b']' * 3_000_000 + b'}}'",
    "one-digit rows": "b'{\"inputs\": {\"input\": [' + b'[0],' * 750_000 + b'[0]]}}'",
}

_MEASURE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from edgesdk.agent.api import tensor_json
    text = {body}
    tail = text.rfind(b'"', 0, tensor_json.HEAD_BYTES) + 1
    cost, opens, _ = tensor_json.parse_cost(text, tail)

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak resident size starts again from now
    before = status("VmRSS:")
    values, shape = tensor_json._flat_numbers(text, "input", opens)
    print(json.dumps({{"peak": status("VmHWM:") - before, "cost": cost, "length": len(text)}}))
    """
)


@pytest.mark.parametrize("kind", sorted(_WORST_BODIES))
def test_no_body_touches_more_memory_than_it_is_charged(kind: str) -> None:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError as exc:
        pytest.skip(f"the peak resident size cannot be reset here (/proc/self/clear_refs: {exc})")
    script = _MEASURE.format(body=_WORST_BODIES[kind])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    measured = json.loads(done.stdout)
    print(kind, measured)
    assert measured["peak"] > 0  # it measured something
    assert measured["peak"] <= measured["cost"], measured


@pytest.mark.parametrize("rows", [1, 3, 5000])
def test_lists_are_counted_the_same_one_by_one_and_in_bulk(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    text = body([[[0.5] * 3] * rows]) + b" [ "  # a stray bracket after the document counts too
    tail = text.index(b"[") - 2
    one_by_one = tensor_json.parse_cost(text, tail)
    monkeypatch.setattr(tensor_json, "FIND_OPENS_MAX", 0)
    in_bulk = tensor_json.parse_cost(text, tail)
    assert one_by_one == in_bulk
    assert one_by_one[1] == 2 + rows + 1
