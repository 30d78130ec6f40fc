"""``{"text": ...}`` → input_ids, attention_mask and token_type_ids through the bundle's
``tokenizer.json`` (Hugging Face ``tokenizers``, the ``pipeline`` extra), in the model's dtypes."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import TextPre

TEXT_TYPES = ("application/json",)
TENSORS = ("input_ids", "attention_mask", "token_type_ids")


def read_text(data: bytes, media_type: str, pre: TextPre) -> str:
    """The request's text: a JSON object ``{"text": "..."}``, at most ``max_chars`` long."""
    if media_type not in TEXT_TYPES:
        raise PipelineInputError(
            415, f'Content-Type {media_type!r} is not text this model takes; send application/json {{"text": ...}}'
        )
    if len(data) > pre.max_chars * 6 + 64:  # at most 6 bytes a character (a \uXXXX escape), plus the braces
        raise PipelineInputError(
            413, f"a body of {len(data)} bytes; this model's text is at most {pre.max_chars} characters"
        )
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PipelineInputError(400, f"not valid JSON: {exc}") from None
    except RecursionError:  # json's C scanner recurses per nesting level: [[[[... overflows the stack
        raise PipelineInputError(400, 'not valid JSON here: nested too deeply; send {"text": "..."}') from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or set(body) != {"text"}:
        raise PipelineInputError(400, 'the body must be {"text": "..."} (one string, no other fields)')
    text: str = body["text"]
    try:  # a "\\ud800" escape decodes to a lone surrogate, which the tokenizer cannot take (TypeError)
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PipelineInputError(
            400, f"the text holds {text[exc.start]!r}, a lone UTF-16 surrogate and not a character; send valid Unicode"
        ) from None
    if len(text) > pre.max_chars:
        raise PipelineInputError(413, f"text of {len(text)} characters; this model takes at most {pre.max_chars}")
    return text


@functools.lru_cache(maxsize=4)
def _tokenizer(document: str, max_length: int, pad: bool) -> Any:
    """The tokenizer of one ``tokenizer.json``, built once per (document, lengths): same str
    object every request, so the cache costs a hash lookup."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PipelineInputError(
            501, "this install has no tokenizer: install it with pip install 'edgesdk[pipeline]' (tokenizers)"
        ) from None
    tokenizer = Tokenizer.from_str(document)
    tokenizer.enable_truncation(max_length)
    if pad:
        tokenizer.enable_padding(length=max_length)
    else:
        tokenizer.no_padding()
    return tokenizer


def tokenize(text: str, pre: TextPre) -> dict[str, np.ndarray]:
    """The three tensors by their tokenizer names, int64, a batch of one."""
    assert pre.tokenizer is not None  # the schema refuses a text pipeline without one
    encoded = _tokenizer(pre.tokenizer, pre.max_length, pre.pad_to_max_length).encode(text)
    values = (encoded.ids, encoded.attention_mask, encoded.type_ids)
    return {name: np.asarray([value], dtype=np.int64) for name, value in zip(TENSORS, values, strict=True)}


def to_feeds(tensors: dict[str, np.ndarray], pre: TextPre, inputs: dict[str, np.dtype[Any]]) -> dict[str, np.ndarray]:
    """Each tensor under the model input it feeds, in that input's dtype; every input fed."""
    feeds = {}
    for name, tensor in tensors.items():
        target = pre.input_names.get(name, name)  # type: ignore[call-overload]
        if target in inputs:
            feeds[target] = tensor.astype(inputs[target], copy=False)
    missing = sorted(set(inputs) - set(feeds))
    if missing:
        raise PipelineInputError(
            422, f"the tokenizer feeds {sorted(feeds)}; the model also takes {missing} (name them in text.input_names)"
        )
    return feeds
