"""The install smoke test's cosine scores an output against itself as 1 however small it is."""

from __future__ import annotations

import numpy as np

from agent.ota.smoke import score


def test_a_near_zero_mask_agrees_with_itself_in_the_smoke_tests_cosine() -> None:
    # Row norms of 1e-13..1e-6, as MediaPipe's selfie segmenter gives on an image without a person.
    rows = np.array([[1e-13, 2e-14, 0.0], [1e-6, 3e-7, 2e-7], [0.0, 0.0, 0.0]], np.float32)
    assert score("cosine", rows, rows.copy()) == 1.0
    assert score("cosine", rows, -rows) < 0  # still a real cosine: opposite rows disagree
