"""``POST /v1/models/{name}/predict`` of a detector through ``ApiApp`` in-process, with a fake
model: its box, found in the model input's pixels, is answered in the sent image's pixels."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from edgesdk.agent.api.http import Request
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.agent_config import ApiConfig
from edgesdk.schemas.manifest import TensorSpec
from edgesdk.schemas.pipeline import Pipeline
from tests.unit.test_agent_api_app import run_requests
from tests.unit.test_agent_serving import variant

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
from edgesdk.agent.api.app import ApiApp  # noqa: E402

DETECTOR = Pipeline.model_validate(
    {
        "image": {"color": "L", "resize": {"height": 8, "width": 8}},
        "post": {"kind": "boxes", "labels": ["thing"], "boxes": {"score_threshold": 0.5}},
    }
)


class OneBoxModel:
    """Always finds one "thing" at (2, 2)-(6, 6) of its 8 x 8 input."""

    thread_safe = True

    def __init__(self) -> None:
        self.inputs = [TensorSpec(name="image", dtype="float32", shape=["batch", 1, 8, 8])]
        self.outputs = [TensorSpec(name="rows", dtype="float32", shape=["batch", 1, 5])]

    def run(self, feeds):
        return {"rows": np.array([[[2, 2, 6, 6, 0.9]]] * len(feeds["image"]), np.float32)}

    def close(self) -> None:
        pass


def test_predict_answers_a_detectors_boxes_in_the_sent_images_pixels() -> None:
    server = ModelServer()
    metrics = Metrics(server)
    server.observe, server.count_error = metrics.observe, metrics.count_error
    model = OneBoxModel()
    server.serve(name="d", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), model)], pipeline=DETECTOR)
    app = ApiApp(server, metrics, ApiConfig())  # type: ignore[arg-type]
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((20, 40), np.uint8)).save(buffer, format="PNG")  # 40 wide, 20 high
    request = Request("POST", "/v1/models/d/predict", "", {"content-type": "image/png"}, buffer.getvalue())
    (answer,) = run_requests(app, [request])
    assert answer.status == 200, answer.body
    result = json.loads(answer.body)
    # Stretched to 8 x 8: x scaled by 8/40, y by 8/20, so (2, 2)-(6, 6) was (10, 5)-(30, 15) of the image.
    assert [(box["label"], box["box"]) for box in result["boxes"]] == [("thing", [10.0, 5.0, 30.0, 15.0])]
    assert result["box_frame"] == {"coordinates": "image_pixels", "format": "xyxy", "width": 40, "height": 20}
