"""The MiniLM workload's sentences: real prose from the standard library, calibration and
validation from different modules, no sentence in both."""

from __future__ import annotations

from edgesdk.workloads.text_encoder import split_sentences


def test_calibration_and_validation_sentences_are_disjoint_and_reproducible() -> None:
    cal, val = split_sentences(calibration=64, validation=320)
    assert len(cal) == 64 and len(val) == 320
    assert not {s.lower() for s in cal} & {s.lower() for s in val}
    assert len(set(val)) == len(val)
    assert all(6 <= len(s.split()) <= 40 for s in cal + val)
    assert split_sentences(calibration=64, validation=320) == (cal, val)
