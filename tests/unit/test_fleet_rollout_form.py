"""The dashboard's *Start a rollout* form with a bad value (issue 40): HTTP 422, the form again
with every value kept and the reason beside the field it is about, not a bare "could not convert
string to float" page with HTTP 200 and the form lost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.service import schema, tokens  # noqa: E402
from edgesdk.fleet.service.dashboard import COOKIE, csrf_for  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.rollout_form import FieldError, plan_from  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402

BUNDLE = {
    "id": "a" * 16,
    "sha256": "a" * 64,
    "filename": "v2.edgepkg",
    "path": "/nonexistent/v2.edgepkg",
    "size": 1,
    "model_name": "m",
    "model_version": "2",
    "model_release": 2,
    "uploaded": 0.0,
    "uploaded_by": "op",
}


@pytest.fixture
def operator_client(tmp_path: Path):
    engine = open_engine(f"sqlite:///{tmp_path / 'form.sqlite3'}")
    migrate(engine)
    with engine.begin() as db:  # a bundle to choose, so the form's own fields are what is checked
        db.execute(schema.bundles.insert().values(**BUNDLE))
    context = ApiContext(engine=engine, store=SqlRolloutStore(engine), commands=None, data_dir=tmp_path)  # type: ignore[arg-type]
    secret = tokens.create_token(engine, name="op", role="operator", created_by="test")[1]
    with TestClient(create_app(context)) as client:
        csrf = re.search(r'name=csrf value="([^"]+)"', client.get("/login").text)
        assert csrf
        client.post("/login", data={"token": secret, "csrf": csrf.group(1)})
        yield client
    engine.dispose()


def test_a_bad_rollout_form_value_is_a_422_beside_its_field_with_the_input_kept(operator_client) -> None:
    client = operator_client
    fields = {"csrf": csrf_for(client.cookies[COOKIE]), "bundle_id": "", "target": "line-7", "canary": "abc"}
    answer = client.post("/ui/deployments", data=fields)
    assert answer.status_code == 422
    assert 'id="error-bundle_id"' in answer.text and "upload a bundle first" in answer.text
    assert 'value="line-7"' in answer.text and 'value="abc"' in answer.text  # what was typed is kept
    assert "could not convert" not in answer.text


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("canary", "abc", "'abc' is not a percentage"),
        ("waves", "50%,20%", "must rise and end at 100%"),
        ("probation_s", "soon", "'soon' is not a number"),
        ("p95_ms", "-3", "0 or more"),
        ("target", " ", "give a group"),
        ("probation_s", "2592001", "at most 2592000 s"),
        ("shadow_s", "-5", "0 or more"),
        ("shadow_s", "2592001", "at most 2592000 s"),
        ("shadow_s", "later", "'later' is not a number"),
        ("shadow_rate", "150%", "between 0% and 100%"),
    ],
)
def test_rollout_form_plan_names_the_bad_field(field: str, value: str, says: str) -> None:
    with pytest.raises(FieldError) as refused:
        plan_from({"target": "line-1", field: value})
    assert refused.value.field == field and says in str(refused.value)


def test_the_rollout_form_offers_a_shadow_phase_and_rate_and_keeps_a_bad_one_beside_its_field(
    operator_client,
) -> None:
    client = operator_client
    overview = client.get("/").text
    assert "name=shadow_s" in overview and "name=shadow_rate" in overview
    fields = {"csrf": csrf_for(client.cookies[COOKIE]), "bundle_id": BUNDLE["id"], "target": "line-7", "shadow_s": "-1"}
    answer = client.post("/ui/deployments", data=fields)
    assert answer.status_code == 422
    assert 'id="error-shadow_s"' in answer.text and 'value="-1"' in answer.text


def test_the_rollout_form_shadow_phase_reaches_the_health_and_lengthens_the_wave_deadline() -> None:
    plan, health, _, _ = plan_from({"target": "line-1", "probation_s": "60", "shadow_s": "300", "shadow_rate": "20%"})
    assert (health.shadow_s, health.shadow_rate, health.probation_s) == (300.0, 0.2, 60.0)
    assert plan.timeout() == 60 + 300 + 600  # as REST: the phase is added to the default deadline
    plain, health, _, _ = plan_from({"target": "line-1", "shadow_s": "0"})
    assert health.shadow_s is None and health.shadow_rate is None  # left off the wire: older agents
    assert plain.wave_timeout_s is None


@pytest.mark.parametrize("asked", [{"shadow_s": "60"}, {"min_agreement": "95%"}])
def test_the_rollout_form_refuses_shadowing_at_a_zero_shadow_rate_beside_the_rate(asked: dict[str, str]) -> None:
    with pytest.raises(FieldError) as refused:
        plan_from({"target": "line-1", "shadow_rate": "0%", **asked})
    assert refused.value.field == "shadow_rate" and "needs a shadow rate above 0%" in str(refused.value)
