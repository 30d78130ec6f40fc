"""A bounded property-based fuzz of the pipeline's decoder entry (edgesdk/pipeline/image.py):
real JPEG and PNG files with bytes flipped, cut or inserted, and random bytes, sent as either
type. Whatever comes, the only error is a ``PipelineInputError`` with a 4xx status (the route's
400/413/415/422), and what decodes is a tensor of exactly the pipeline's shape and dtype.

Bounded: 300 examples, no deadline per example (the machine is shared); runs in a few seconds."""

from __future__ import annotations

import io

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the dev extra installs it)")
Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.pipeline.image import PipelineInputError, open_image, to_tensor  # noqa: E402
from edgesdk.schemas.pipeline import Pipeline  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRE = Pipeline.model_validate(
    {"image": {"resize": {"height": 8, "width": 8}, "scale": 1 / 255, "max_pixels": 4096}}
).image


def _encoded(fmt: str) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


SEEDS = {"image/jpeg": _encoded("JPEG"), "image/png": _encoded("PNG")}


@st.composite
def mutated_images(draw: st.DrawFn) -> tuple[bytes, str]:
    media = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(draw(st.sampled_from(list(SEEDS.values()))))
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del data[at:]
            if not data:
                break
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data), media


@FUZZ
@given(st.one_of(mutated_images(), st.tuples(st.binary(max_size=256), st.sampled_from(sorted(SEEDS)))))
def test_decoder_entry_answers_any_bytes_with_a_tensor_or_a_4xx(case: tuple[bytes, str]) -> None:
    data, media = case
    try:
        tensor = to_tensor(open_image(data, media, PRE.max_pixels), PRE, np.dtype("float32"))
    except PipelineInputError as refused:
        assert 400 <= refused.status < 500, refused
        return
    assert tensor.shape == (1, 3, 8, 8) and tensor.dtype == np.float32
    assert np.isfinite(tensor).all()
