"""DeviceModels (agent/device_models.py) with real ModelServers over fake runtimes: requests route by
model name through the default model's server, a pinned model starts on its precision and is
never moved by another model's load, and the budget counts the other models only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from edgesdk.agent.device_models import DeviceModels, ModelParts
from edgesdk.agent.events import EventBus
from edgesdk.agent.installed_models import InstalledModels
from edgesdk.agent.memory_budget import ModelRamBudget, ModelRamBudgetError
from edgesdk.agent.metrics import InferenceStats
from edgesdk.agent.serving import ModelNotFoundError, ModelServer

from edgesdk.errors import AgentError
from edgesdk.schemas.common import Precision
from tests.unit.test_agent_serving import FakeModel, variant, x


def device_models(
    tmp_path: Path, *, budget_mb: float = 100.0, pins: dict[str, Precision] | None = None
) -> DeviceModels:
    events = EventBus()
    stats = InferenceStats()
    default = ModelServer(events=events, observe=stats.observe, count_error=stats.count_error)

    def make_entry(name: str, store) -> ModelParts:
        own = InferenceStats()
        return ModelParts(name, ModelServer(events=events, observe=own.observe), own, store)

    return DeviceModels(
        InstalledModels(tmp_path / "data"),
        default,
        stats,
        make_entry=make_entry,
        budget=ModelRamBudget(budget_mb, "test"),
        events=events,
        pins=pins,
    )


def serve(server: ModelServer, name: str, factor: float) -> None:
    server.serve(
        name=name,
        version="1.0.0",
        release=1,
        variants=[(variant("fp32", "fp32"), FakeModel(factor)), (variant("int8", "int8"), FakeModel(factor * 10))],
    )


def test_requests_route_by_name_through_the_default_models_server(tmp_path: Path) -> None:
    models = device_models(tmp_path)
    serve(models.entry("digits").server, "digits", 1.0)  # the first model becomes the default
    kws = models.entry("kws")
    serve(kws.server, "kws", 3.0)
    api_server = models.default_server
    assert models.default_name == "digits" and models.entry("digits").server is api_server
    assert np.allclose(api_server.infer("digits", {"x": x()})["y"], 1.0)
    assert np.allclose(api_server.infer("kws", {"x": x()})["y"], 3.0)
    assert kws.stats.totals() == {"fp32": 1}  # each model's own statistics
    assert [m["name"] for m in api_server.describe_models()] == ["digits", "kws"]
    with pytest.raises(ModelNotFoundError, match=r"served: \['digits', 'kws'\]"):
        api_server.infer("wakeword", {"x": x()})
    assert [r.name for r in models.running_models()] == ["digits", "kws"]


def test_a_pinned_model_starts_on_its_precision_and_stays_there(tmp_path: Path) -> None:
    models = device_models(tmp_path, pins={"kws": Precision.INT8})
    serve(models.entry("digits").server, "digits", 1.0)
    kws = models.entry("kws")
    serve(kws.server, "kws", 1.0)
    assert kws.server.model.active.id == "int8"
    serve(models.default_server, "digits", 2.0)  # another model's load does not move it
    assert kws.server.model.active.id == "int8"
    assert models.entry("digits").server.model.active.id == "fp32"


def test_the_budget_counts_the_other_models_and_refuses_another_models_bundle(tmp_path: Path) -> None:
    models = device_models(tmp_path, budget_mb=10.0)
    serve(models.entry("digits").server, "digits", 1.0)
    serve(models.entry("kws").server, "kws", 1.0)
    assert models.memory()["models"] == {"digits": pytest.approx(0.0, abs=0.01), "kws": pytest.approx(0.0, abs=0.01)}

    def manifest(name: str, load_mb: float):
        return SimpleNamespace(
            model=SimpleNamespace(name=name, version="2.0.0"),
            variants=[variant("fp32", "fp32").model_copy(update={"load_rss_mb": load_mb})],
        )

    models.admit("kws", manifest("kws", 9.9))  # kws's own current size is not counted
    with pytest.raises(ModelRamBudgetError, match="needs 10.5 MB"):
        models.admit("kws", manifest("kws", 10.5))
    with pytest.raises(AgentError, match="bundle is model 'digits', not 'kws'"):
        models.admit("kws", manifest("digits", 1.0))


def test_telemetry_and_metrics_carry_every_model_with_its_label(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from edgesdk.agent.metrics import Metrics

    from edgesdk.schemas.messages import Telemetry

    models = device_models(tmp_path)
    serve(models.entry("digits").server, "digits", 1.0)
    serve(models.entry("kws").server, "kws", 1.0)
    models.default_server.infer("kws", {"x": x()})
    metrics = Metrics(models.default_server, stats=models.default_stats)
    metrics.attach_models(models)
    snapshot = metrics.snapshot()
    telemetry = Telemetry(device_id="d", msg_id="m", seq=0, ts=datetime.now(timezone.utc), **snapshot)
    assert [m.model.name for m in telemetry.models] == ["digits", "kws"]
    assert telemetry.models[1].latency["fp32"].count == 1 and telemetry.model_budget_mb == 100.0
    text = metrics.prometheus()
    assert 'edgesdk_agent_model_inferences_total{model="kws",variant="fp32"} 1' in text
    assert 'edgesdk_agent_model_inference_latency_seconds_count{model="kws",variant="fp32"} 1' in text
    assert "edgesdk_agent_model_budget_bytes 104857600" in text
