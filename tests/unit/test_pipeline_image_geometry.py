"""Boxes found in the model input's pixels, mapped back to the sent image's (issue 42): resize
+ center crop and letterbox, each against boxes computed by hand; the letterboxed pixels sit
where the mapping says they do."""

from __future__ import annotations

import io

import numpy as np
import pytest

from edgesdk.pipeline import postprocess, prepare
from edgesdk.pipeline.geometry import image_frame
from edgesdk.schemas.manifest import TensorSpec
from edgesdk.schemas.pipeline import ImagePre, Pipeline

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")

STRETCH_AND_CROP = ImagePre.model_validate(
    {"resize": {"height": 256, "width": 256}, "center_crop": {"height": 224, "width": 224}}
)
LETTERBOX = ImagePre.model_validate({"resize": {"height": 320, "width": 320, "letterbox": {}}})


def test_resize_and_crop_boxes_map_back_to_the_sent_images_pixels() -> None:
    # 640 x 480 stretched to 256 x 256 (x 0.4, y 0.5333), then the central 224 x 224 (from 16, 16).
    frame = image_frame(640, 480, STRETCH_AND_CROP)
    whole_crop, past_the_edge = [0, 0, 224, 224], [-10, 100, 230, 300]
    mapped = frame.to_image(np.array([whole_crop, past_the_edge], dtype=np.float64))
    # (x + 16) / 0.4 and (y + 16) * 480 / 256; the second clipped to the image's 480 rows.
    np.testing.assert_allclose(mapped, [[40, 30, 600, 450], [15, 217.5, 615, 480]])


def test_letterbox_boxes_lose_the_padding_and_the_scale() -> None:
    # 640 x 480 into 320 x 320: scale 0.5, 320 x 240 placed 40 rows down.
    frame = image_frame(640, 480, LETTERBOX)
    inside, in_the_padding = [32, 40, 96, 120], [10, 0, 50, 30]
    mapped = frame.to_image(np.array([inside, in_the_padding], dtype=np.float64))
    np.testing.assert_allclose(mapped, [[64, 0, 192, 160], [20, 0, 100, 0]])
    # An odd margin: 300 x 200 into 128 x 128 is 128 x 85 (round(85.33)), 21 rows above, 22 below
    # (Ultralytics' LetterBox); the placed image maps back onto the whole image.
    odd = image_frame(300, 200, ImagePre.model_validate({"resize": {"height": 128, "width": 128, "letterbox": {}}}))
    np.testing.assert_allclose(odd.to_image(np.array([[0.0, 21, 128, 106]])), [[0, 0, 300, 200]])


def test_letterboxed_pixels_sit_where_the_frame_puts_them() -> None:
    red = np.zeros((50, 100, 3), np.uint8)
    red[:, :, 0] = 200
    pipeline = Pipeline.model_validate(
        {"image": {"resize": {"height": 64, "width": 64, "letterbox": {"fill": 7}}, "layout": "NHWC"}}
    )
    prepared = prepare(pipeline, _png(red), "image/png", [TensorSpec(name="x", dtype="float32", shape=[1, 64, 64, 3])])
    pixels = prepared.feeds["x"][0]
    # 100 x 50 at scale 0.64 is 64 x 32, 16 rows of fill above and below.
    assert (pixels[:16] == 7).all() and (pixels[48:] == 7).all()
    np.testing.assert_array_equal(pixels[16:48, :, 0], 200)
    assert prepared.frame is not None and prepared.frame.offset_y == 16 and prepared.frame.scale_x == 0.64


def test_detector_answer_gives_boxes_in_the_sent_images_pixels_and_says_so() -> None:
    pipeline = Pipeline.model_validate(
        {
            "image": {"resize": {"height": 320, "width": 320, "letterbox": {}}},
            "post": {"kind": "boxes", "labels": ["cat", "dog"], "boxes": {"score_threshold": 0.5}},
        }
    )
    prepared = prepare(pipeline, _png(np.zeros((480, 640, 3), np.uint8)), "image/png", [_spec()])
    rows = np.array([[[32, 40, 96, 120, 0.1, 0.9], [0, 0, 5, 5, 0.2, 0.1]]], np.float32)  # a dog, and a miss
    answer = postprocess(pipeline, {"out": rows}, prepared.feeds, prepared.frame)
    assert [(box["label"], box["box"]) for box in answer["boxes"]] == [("dog", [64.0, 0.0, 192.0, 160.0])]
    assert answer["box_frame"] == {"coordinates": "image_pixels", "format": "xyxy", "width": 640, "height": 480}
    # Without the frame (the host's tensor-level checks) the boxes stay where the model put them, and say so.
    unmapped = postprocess(pipeline, {"out": rows}, prepared.feeds)
    assert unmapped["boxes"][0]["box"] == [32.0, 40.0, 96.0, 120.0]
    assert unmapped["box_frame"]["coordinates"] == "model_input_pixels"


def test_a_crop_larger_than_the_resized_image_is_refused_before_decoding() -> None:
    pipeline = Pipeline.model_validate({"image": {"center_crop": {"height": 64, "width": 64}}})
    truncated = _png(np.random.default_rng(0).integers(0, 255, (32, 48, 3), np.uint8))[:200]  # header intact
    with pytest.raises(Exception, match="smaller than the center crop 64x64") as refused:
        prepare(pipeline, truncated, "image/png", [_spec()])  # decoding it would be a 400
    assert getattr(refused.value, "status", None) == 422


def _spec() -> TensorSpec:
    return TensorSpec(name="x", dtype="float32", shape=[1, 3, "h", "w"])


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
