"""Inference plans (agent/api/plan.py): worked out once per (model, encoding, body layout) and
cached on the served model, usable without HTTP (decode a body, encode outputs), shared by
header blocks that differ only in what the plan does not depend on, and gone with a swap."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from edgesdk.agent.api.codec import JSON, RAW
from edgesdk.agent.api.http import field_lines
from edgesdk.agent.api.plan import InferencePlan, plan_for
from edgesdk.agent.serving import ModelServer, ServedModel

from tests.unit.test_agent_api_prepared import Agent, json_text, raw_request, values
from tests.unit.test_agent_serving import FakeModel, variant


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def served(server: ModelServer) -> ServedModel:
    model = server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), FakeModel(2.0))])
    return model


def json_plan(model: ServedModel, length: int) -> InferencePlan | None:
    return plan_for(model, JSON, JSON, query="", tensors_header="", length=length, max_decoded=1 << 24, batch_max=1)


def test_a_plan_decodes_and_encodes_without_http_as_the_generic_path_answers() -> None:
    model = served(ModelServer())
    body = json_text(values(3))
    plan = json_plan(model, len(body))
    assert plan is not None and plan.content_type == JSON and plan.model() is model
    feeds = plan.decode(body, None)
    np.testing.assert_array_equal(feeds["x"], values(3))
    encoded, fields = plan.encode({"y": feeds["x"] * 2}, "fp32")
    assert orjson.loads(encoded) == {"model": "m", "version": "1.0.0", "variant": "fp32", "outputs": {"y": [[8.0] * 4]}}
    # Transport-neutral fields, the same object on every answer (the HTTP adapter alone spells them).
    assert fields.variant == "fp32" and fields.tensors is None and fields.lasting
    assert plan.encode({"y": feeds["x"]}, "fp32")[1] is fields
    assert field_lines(fields) == "X-Model-Variant: fp32\r\n"


def test_plans_are_made_once_per_layout_and_dropped_with_the_model() -> None:
    server = ModelServer()
    model = served(server)
    first = json_plan(model, 40)
    assert json_plan(model, 40) is first  # cached
    assert json_plan(model, 41) is not first  # another layout (length), another plan
    # A layout with no plan is remembered too: raw tensors that are not the model's inputs.
    assert (
        plan_for(
            model, RAW, RAW, query="", tensors_header="z=float32[1,4]", length=16, max_decoded=1 << 24, batch_max=1
        )
        is None
    )
    assert len(model.plans) == 3
    again = served(server)  # a swap: a new model, no plans; the old one's go with it
    assert again.plans == {} and json_plan(again, 40) is not first


def test_header_blocks_that_differ_elsewhere_share_one_plan(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    for i in range(3):
        assert agent.send(raw_request(values(i)))[0] == 200
        assert agent.send(raw_request(values(i), extra="User-Agent: other\r\n"))[0] == 200
    routes = [known.route for known in agent.http.known_heads.values()]
    assert len(routes) == 2 and all(route is not None for route in routes)
    assert routes[0] is not routes[1]  # each block its own route (its connection-side state)
    assert routes[0].decode is routes[1].decode  # type: ignore[union-attr]  # around one plan
    model = agent.server.model
    # One plan for the layout (the prepared routes'), one for the generic route that answered
    # each block's first request (any length).
    assert model is not None and len(model.plans) == 2


def test_the_transport_neutral_modules_import_nothing_of_http() -> None:
    """Below the HTTP adapter (app.py, prepared.py, http.py) no module knows HTTP's types: gRPC's
    translation, the codecs, the plans, the scheduler, the answers and the error table."""
    import ast
    from pathlib import Path

    import edgesdk.agent.api as api

    folder = Path(api.__path__[0])
    neutral = [
        "answer",
        "codec",
        "grpc_codec",
        "grpc_server",
        "open_inference",
        "plan",
        "refusal",
        "scheduler",
        "budget",
    ]
    for name in neutral:
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module is not None
        } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not {m for m in imported if m.endswith("api.http") or m.endswith("api.app")}, name
