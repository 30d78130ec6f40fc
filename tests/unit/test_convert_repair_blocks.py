"""Repair keeps whole blocks in float: block names from exported layer names, and the rounds."""

from __future__ import annotations

from edgesdk.converters.sensitivity import block_of, block_rounds


def test_blocks_come_from_the_first_indexed_module_of_the_name() -> None:
    assert block_of("/features/features.3/conv/conv.0/conv.0.0/Conv") == "/features/features.3"
    assert block_of("/bert/encoder/layer.0/attention/self/query/MatMul") == "/bert/encoder/layer.0"
    assert block_of("/classifier/classifier.1/Gemm") == "/classifier/classifier.1"
    assert block_of("/fc/Gemm") == "/fc/Gemm"  # no indexed part: the layer is its own block
    assert block_of("Conv_12") == "Conv_12"


def test_rounds_grow_block_by_block_within_the_limit() -> None:
    layers = [f"/features/features.{b}/conv/conv.{i}/Conv" for b in range(1, 6) for i in range(3)]
    ranking = [layers[7], layers[8], layers[1], layers[13]]  # blocks 3, 3, 1, 5
    rounds = block_rounds(ranking, layers, limit=7)
    assert [names for names, _ in rounds] == ["/features/features.3", "/features/features.3, /features/features.1"]
    assert rounds[0][1] == layers[6:9]
    assert rounds[1][1] == layers[0:3] + layers[6:9]  # in graph order
    assert block_rounds(ranking, layers, limit=2) == []  # one block already exceeds the limit
