"""Fixtures for integration tests: a real mosquitto broker on an ephemeral port.

Other fixtures are added here additively by each part's tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto


def require_mosquitto() -> None:
    """Skip (visibly) when the mosquitto binary is not installed."""
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; scripts/test installs it)")


@pytest.fixture
def mqtt_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A running anonymous mosquitto on 127.0.0.1 (``.url``, ``.port``, ``.stop()``, ``.restart()``)."""
    require_mosquitto()
    broker = MosquittoBroker(data_dir=tmp_path / "mosquitto")
    with broker:
        yield broker


@pytest.fixture(scope="session")
def convert_dir(digits, request) -> Path:
    """The digits CNN converted for the agent (onnx-fp32 and onnx-int8), cached in pytest's cache folder and
    built by one test process at a time; a test module may override it with its own variants."""
    from tests.bundle_helpers import make_digits_convert_dir

    return make_digits_convert_dir(digits, Path(request.config.cache.mkdir("edgesdk-agent-digits-convert-v1")) / "out")


@pytest.fixture(scope="module")
def images(digits):
    """Eight validation images of the digits CNN (a test module may override the count)."""
    import numpy as np

    return np.load(digits.validation)["image"][:8]


@pytest.fixture(scope="module")
def reference(digits, images):
    """The digits CNN's logits for ``images`` straight from onnxruntime: what the agent must answer."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"image": images})[0]
