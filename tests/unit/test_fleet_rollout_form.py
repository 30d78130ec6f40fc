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

from edgesdk.fleet.service import tokens  # noqa: E402
from edgesdk.fleet.service.api import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.dashboard import COOKIE, csrf_for  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.rollout_form import FieldError, plan_from  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402


@pytest.fixture
def operator_client(tmp_path: Path):
    engine = open_engine(f"sqlite:///{tmp_path / 'form.sqlite3'}")
    migrate(engine)
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
    ],
)
def test_rollout_form_plan_names_the_bad_field(field: str, value: str, says: str) -> None:
    with pytest.raises(FieldError) as refused:
        plan_from({"target": "line-1", field: value})
    assert refused.value.field == field and says in str(refused.value)
