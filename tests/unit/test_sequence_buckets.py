"""Sequence buckets (edgesdk/runtimes/sequence_buckets.py): which lengths, how a request is cut
and padded. The converter and the LiteRT runtime use them (tests/integration/test_convert_multi_input.py
runs them on a real model and a real agent)."""

from __future__ import annotations

import numpy as np

from edgesdk.runtimes.sequence_buckets import bucket_signature, choose_buckets, is_bucket, pad, trim, used_lengths


def test_used_length_is_one_past_the_last_non_zero_position_of_any_sequence_input() -> None:
    ids = np.array([[5, 6, 7, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    # The mask's fourth position counts even where the id is 0 (a real token may have id 0).
    assert used_lengths({"ids": ids, "mask": mask}, {"ids": 1, "mask": 1}).tolist() == [4, 1, 1, 6]


def test_used_length_reads_the_sequence_axis_where_the_model_has_it() -> None:
    features = np.zeros((2, 4, 10))  # samples, channels, sequence
    features[0, 2, 6] = 1.0
    features[1, 0, 1] = 1.0
    assert used_lengths({"x": features}, {"x": 2}).tolist() == [7, 2]


def test_buckets_sit_at_the_quantiles_rounded_up_below_the_longest() -> None:
    lengths = np.array([5, 9, 11, 12, 13, 14, 20, 30, 32])
    assert choose_buckets(lengths, 32) == [16]  # 10th/50th -> 16; the 90th rounds up to 32, the longest
    assert choose_buckets(np.arange(1, 129), 128) == [16, 72, 120]  # 13.7, 64.5, 115.3
    assert choose_buckets(np.full(10, 32), 32) == []  # every sample is full length: nothing to gain


def test_a_request_is_cut_to_its_used_length_and_padded_to_a_bucket() -> None:
    feeds = {"ids": np.array([[5, 6, 0, 0]]), "mask": np.array([[1, 1, 0, 0]]), "scale": np.array([0.5])}
    cut = trim(feeds, {"ids": 1, "mask": 1})
    assert cut["ids"].tolist() == [[5, 6]] and cut["mask"].tolist() == [[1, 1]] and cut["scale"] is feeds["scale"]
    assert pad(cut["ids"], 1, 8).tolist() == [[5, 6, 0, 0, 0, 0, 0, 0]]
    assert pad(feeds["ids"], 1, 2) is feeds["ids"]  # never cut by padding


def test_bucket_signatures_are_told_apart_from_a_models_own() -> None:
    assert bucket_signature(16) == "edgesdk_seq_16" and is_bucket("edgesdk_seq_16")
    assert not is_bucket("serving_default") and not is_bucket("decode")
