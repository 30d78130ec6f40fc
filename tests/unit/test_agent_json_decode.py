"""JSON request bodies: numbers read straight into a float input's dtype when the body holds no
string but its keys (codec.decode_json, the prepared route's decoder), and every other body
answered as numpy's general reading (float64 first) always answered it."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.api import codec
from edgesdk.agent.api.budget import unlimited_allowance
from edgesdk.agent.api.codec import DecodeError, decode_json, only_key_strings
from edgesdk.agent.tensor_signature import Signature, TensorSlot

from edgesdk.errors import InferenceInputError


def signature(dtype: str = "float32", allow_nonfinite: bool = False) -> Signature:
    return Signature(
        [TensorSlot("image", np.dtype(dtype), ("batch", 4))],
        [TensorSlot("logits", np.dtype("float32"), ("batch", 2))],
        allow_nonfinite=allow_nonfinite,
    )


def body(rows: Any, **extra: Any) -> bytes:
    return json.dumps({"inputs": {"image": rows}, **extra}).encode()


def general_reading(rows: Any, dtype: str) -> np.ndarray:
    """What decode_json did for every body before: numpy's reading, then the conversion."""
    with np.errstate(over="ignore"):  # float16 rounds 1e38 to Inf, as the general reading does
        return np.asarray(rows).astype(dtype)


NUMBERS: list[Any] = [
    [[0.1, -2.5, 3e-41, 1e38]],  # a float32 subnormal and a value near float32's largest
    [[1, 2, 3, -4]],  # integers for a float input
    [[True, False, 1.5, 0]],  # booleans read as 1 and 0, both ways
    [[-0.0, 0.0, 16777217, 2**40]],  # -0 kept; integers rounded as float64 then float32 round them
    [[0.30000000000000004, 1 / 3, 2.0**-149, 123456789.123456789]],
    [[1.0, 2.0, 3.0, 4.0]] * 3,
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("rows", NUMBERS)
def test_numbers_only_bodies_give_exactly_the_general_readings_arrays(rows: Any, dtype: str) -> None:
    with np.errstate(over="ignore"):
        fed = decode_json(body(rows), signature(dtype), unlimited_allowance())["image"]
    expected = general_reading(rows, dtype)
    assert fed.dtype == expected.dtype and fed.shape == expected.shape
    assert fed.tobytes() == expected.tobytes()  # bit for bit, -0.0 and rounding included


def test_numbers_only_bodies_skip_the_float64_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of it: no general reading (float64 array, then a conversion) for plain numbers."""
    calls: list[Any] = []
    reading = codec._numbers
    monkeypatch.setattr(codec, "_numbers", lambda value, name: calls.append(name) or reading(value, name))
    decode_json(body([[0.5, 1, 2, 3]]), signature(), unlimited_allowance())
    assert calls == []
    # A string anywhere but the keys (here in another top-level member) and the general reading
    # is back, with the same arrays.
    fed = decode_json(body([[0.5, 1, 2, 3]], note="x"), signature(), unlimited_allowance())["image"]
    assert calls == ["image"] and fed.tolist() == [[0.5, 1, 2, 3]]


@pytest.mark.parametrize(
    ("text", "error", "says"),
    [
        # numpy would read "1.5" as 1.5 and null as NaN in a float array: the general reading refuses them.
        (body([["1.5", 2, 3, 4]]), InferenceInputError, "values must be numbers"),
        (body([[None, 2, 3, 4]]), InferenceInputError, "values must be numbers"),
        (body([[{}, 2, 3, 4]]), InferenceInputError, "values must be numbers"),
        (body([[1, 2, 3, [4]]]), DecodeError, "rectangular"),
        (body([[1, 2, 3, 4], [1, 2]]), DecodeError, "rectangular"),
        (b'{"inputs": {"ima\\"ge": [[1, 2, 3, 4]]}}', InferenceInputError, "unknown input"),
    ],
)
def test_other_bodies_get_the_general_readings_answer(text: bytes, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        decode_json(text, signature(), unlimited_allowance())


@pytest.mark.parametrize("allow_nonfinite", [False, True])
def test_an_overflow_reads_as_infinity_both_ways_and_the_check_decides(allow_nonfinite: bool) -> None:
    model = signature(allow_nonfinite=allow_nonfinite)
    with np.errstate(over="ignore"):
        fed = decode_json(body([[1e39, -1e39, 1, 2]]), model, unlimited_allowance())
    assert fed["image"].tolist() == [[np.inf, -np.inf, 1, 2]]
    if allow_nonfinite:
        model.check(fed)
    else:
        with pytest.raises(InferenceInputError, match="NaN or Inf"):
            model.check(fed)


def test_nan_written_by_pythons_json_is_read_and_refused_by_the_check() -> None:
    fed = decode_json(b'{"inputs": {"image": [[NaN, 1, 2, 3]]}}', signature(), unlimited_allowance())
    assert np.isnan(fed["image"][0, 0])
    with pytest.raises(InferenceInputError, match="NaN or Inf"):
        signature().check(fed)


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["number", "number", "list", "string", "object", "literal"] if depth < 3 else ["number"])
    if kind == "number":
        return rng.choice([rng.random() * 1e6, rng.randint(-5, 5), -0.0])
    if kind == "literal":
        return rng.choice([None, True, False])
    if kind == "string":
        return rng.choice(["", "a", 'say "hi"', "back\\slash", '\\"', "é"])
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_random_key(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _random_key(rng: random.Random) -> str:
    return rng.choice(["inputs", "image", 'a"b', "c\\", "", "ünï"])


def _strings(value: Any) -> tuple[int, int]:
    """(object keys, other strings) in ``value``, the reference only_key_strings answers to. A
    key with a quote in it counts as another string too: escaped, its quotes are more than two,
    and only_key_strings says no (the general reading then takes the body: slower, not wrong)."""
    if isinstance(value, str):
        return 0, 1
    if isinstance(value, list):
        pairs = [_strings(item) for item in value]
        return sum(k for k, _ in pairs), sum(s for _, s in pairs)
    if isinstance(value, dict):
        pairs = [_strings(item) for item in value.values()]
        quoted = sum('"' in key for key in value)
        return len(value) + sum(k for k, _ in pairs), quoted + sum(s for _, s in pairs)
    return 0, 0


@pytest.mark.parametrize("count_below", [0, 1 << 20], ids=["memchr", "bytes.count"])
def test_only_key_strings_agrees_with_a_walk_of_the_parsed_document(
    monkeypatch: pytest.MonkeyPatch, count_below: int
) -> None:
    # Both ways of finding the quotes: memchr (long bodies) and one count (short ones).
    monkeypatch.setattr(codec, "_COUNT_QUOTES_MAX", count_below)
    rng = random.Random(15)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        document = {_random_key(rng): _random_value(rng, 0) for _ in range(rng.randint(1, 3))}
        keys, values = _strings(document)
        for text in (json.dumps(document), json.dumps(document, ensure_ascii=False, separators=(",", ":"))):
            answer = only_key_strings(text.encode(), keys)
            assert answer == (values == 0), text
            seen[answer] += 1
    assert min(seen.values()) > 300  # both answers were exercised
