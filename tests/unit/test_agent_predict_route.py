"""``POST /v1/models/{name}/predict`` through ``ApiApp`` in-process, with a fake model: the
image goes through the same admission control and server path as ``/infer``, never on the
event loop (decoding a JPEG there would stall every connection), and each bad input is its 4xx."""

from __future__ import annotations

import io
import json
import threading

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

PIPELINE = Pipeline.model_validate(
    {
        "image": {"color": "L", "resize": {"height": 2, "width": 2, "interpolation": "nearest"}, "scale": 1 / 255},
        "post": {"top_k": 2, "labels": ["top-left", "top-right", "bottom-left", "bottom-right"]},
    }
)


class PixelModel:
    """logits = the 2 × 2 grey image's pixels, flattened (so the brightest pixel wins)."""

    thread_safe = True

    def __init__(self) -> None:
        self.inputs = [TensorSpec(name="image", dtype="float32", shape=["batch", 1, 2, 2])]
        self.outputs = [TensorSpec(name="logits", dtype="float32", shape=["batch", 4])]
        self.threads: list[str] = []

    def run(self, feeds):
        self.threads.append(threading.current_thread().name)
        return {"logits": feeds["image"].reshape(len(feeds["image"]), 4)}

    def close(self) -> None:
        pass


def _app(pipeline: Pipeline | None, **config: object) -> tuple[ApiApp, PixelModel]:
    server = ModelServer()
    metrics = Metrics(server)
    server.observe, server.count_error = metrics.observe, metrics.count_error
    model = PixelModel()
    server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), model)], pipeline=pipeline)
    return ApiApp(server, metrics, ApiConfig(**config)), model  # type: ignore[arg-type]


def _png(pixels: list[list[int]]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.array(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _predict(body: bytes, content_type: str = "image/png") -> Request:
    return Request("POST", "/v1/models/m/predict", "", {"content-type": content_type}, body)


def test_predict_ranks_labels_through_the_server_and_never_runs_on_the_event_loop() -> None:
    app, model = _app(PIPELINE, inline_max_ms=60_000)  # a tiny model: /infer would be answered inline
    app.scheduler.inline_left = 8
    bright_bottom_left = _png([[10, 20], [250, 30]])
    (answer,) = run_requests(app, [_predict(bright_bottom_left)])
    assert answer.status == 200, answer.body
    labels = json.loads(answer.body)["labels"]
    assert [entry["label"] for entry in labels] == ["bottom-left", "bottom-right"]
    assert labels[0]["score"] == pytest.approx(250 / 255)
    assert model.threads and all(name != "MainThread" for name in model.threads)
    app.close()


def test_predict_bad_inputs_are_their_4xx_and_a_model_without_pipeline_is_404() -> None:
    app, _ = _app(PIPELINE)
    answers = run_requests(
        app,
        [
            _predict(b"\x89PNG\r\n\x1a\n" + bytes(40)),
            _predict(_png([[1, 2], [3, 4]]), "image/gif"),
            _predict(_png([[1, 2], [3, 4]])),  # and a good one after them is answered
        ],
    )
    assert [a.status for a in answers] == [400, 415, 200]
    app.close()
    bare, _ = _app(None)
    (missing,) = run_requests(bare, [_predict(_png([[1, 2], [3, 4]]))])
    assert missing.status == 404 and b"/v1/models/m/infer" in missing.body
    bare.close()


def test_predict_refuses_an_image_over_max_pixels_before_decoding_with_413() -> None:
    small = PIPELINE.model_copy(update={"image": PIPELINE.image.model_copy(update={"max_pixels": 100})})
    app, model = _app(small)
    (answer,) = run_requests(app, [_predict(_png(np.zeros((20, 20), np.uint8).tolist()))])
    assert answer.status == 413 and b"400 pixels" in answer.body
    assert model.threads == []  # the model never ran
    app.close()
