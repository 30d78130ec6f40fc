"""The pipeline's text step (edgesdk/pipeline/text.py): ``{"text": ...}`` through a tokenizer.json
into the model's inputs, checked against the tokenizer run by hand, and each bad body a 4xx."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import UsageError
from edgesdk.pipeline import PipelineInputError, preprocess
from edgesdk.schemas.manifest import TensorSpec
from edgesdk.schemas.pipeline import Pipeline, load_pipeline

tokenizers = pytest.importorskip(
    "tokenizers", reason="the text step needs tokenizers (pip install 'edgesdk[pipeline]')"
)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "##s"]
INPUTS = [
    TensorSpec(name=n, dtype="int32", shape=["batch", "sequence"]) for n in ("ids", "attention_mask", "token_type_ids")
]


def _tokenizer_json() -> str:
    """A small BERT-style WordPiece tokenizer, as a tokenizer.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return str(tokenizer.to_str())


def _pipeline(**text: object) -> Pipeline:
    spec = {"tokenizer": _tokenizer_json(), "input_names": {"input_ids": "ids"}, **text}
    return Pipeline.model_validate({"input": "text", "text": spec, "post": {"kind": "embedding"}})


def test_text_is_tokenized_into_the_models_inputs_and_dtypes() -> None:
    feeds = preprocess(_pipeline(), json.dumps({"text": "The cats sat on a mat"}).encode(), "application/json", INPUTS)
    # [CLS] the cat ##s sat on [UNK] mat [SEP]
    assert feeds["ids"].tolist() == [[2, 4, 5, 9, 6, 7, 1, 8, 3]]
    assert feeds["attention_mask"].tolist() == [[1] * 9] and feeds["token_type_ids"].tolist() == [[0] * 9]
    assert all(tensor.dtype == np.int32 for tensor in feeds.values())

    padded = preprocess(
        _pipeline(max_length=6, pad_to_max_length=True), b'{"text": "the cat"}', "application/json", INPUTS
    )
    assert padded["ids"].tolist() == [[2, 4, 5, 3, 0, 0]] and padded["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0]]
    cut = preprocess(_pipeline(max_length=4), b'{"text": "the cat sat on the mat"}', "application/json", INPUTS)
    assert cut["ids"].tolist() == [[2, 4, 5, 3]]


def test_bad_text_bodies_are_4xx_with_the_reason() -> None:
    pipeline = _pipeline(max_chars=10)
    cases = {
        (b'{"text": "the cat"}', "text/plain"): (415, "application/json"),
        (b'{"text": "the cat"', "application/json"): (400, "not valid JSON"),
        (b'{"text": 7}', "application/json"): (400, "one string"),
        (b'{"text": "a", "extra": 1}', "application/json"): (400, "no other fields"),
        (b'{"text": "the cat sat on"}', "application/json"): (413, "at most 10"),
        (b'{"text": "' + b"x" * 200 + b'"}', "application/json"): (413, "bytes"),
    }
    for (body, media), (status, reason) in cases.items():
        with pytest.raises(PipelineInputError, match=reason) as refused:
            preprocess(pipeline, body, media, INPUTS)
        assert refused.value.status == status, reason
    extra = [*INPUTS, TensorSpec(name="position_ids", dtype="int64", shape=["batch", "sequence"])]
    with pytest.raises(PipelineInputError, match=r"also takes \['position_ids'\]") as unfed:
        preprocess(pipeline, b'{"text": "the"}', "application/json", extra)
    assert unfed.value.status == 422


def test_packaging_reads_the_tokenizer_file_into_the_pipeline(tmp_path) -> None:
    (tmp_path / "pipeline.yaml").write_text("input: text\ntext: {max_length: 16}\npost: {kind: embedding}\n")
    (tmp_path / "tokenizer.json").write_text(_tokenizer_json())
    pipeline = load_pipeline(tmp_path / "pipeline.yaml", tokenizer=tmp_path / "tokenizer.json")
    assert pipeline.text.tokenizer is not None and json.loads(pipeline.text.tokenizer)["model"]["type"] == "WordPiece"
    (tmp_path / "bad.json").write_text('{"model": {"type": "Nope"}}')
    with pytest.raises(UsageError, match=r"--tokenizer .*bad.json: not a tokenizers tokenizer.json"):
        load_pipeline(tmp_path / "pipeline.yaml", tokenizer=tmp_path / "bad.json")
