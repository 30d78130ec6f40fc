"""``HealthCriteria.min_agreement`` / ``shadow_rate`` (issue 41): left out of the wire and the
signed bytes when unused (older agents forbid unknown fields), signed when used, and the same
numbers from ``fleet push`` options, the REST body and the dashboard's rollout form."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from edgesdk.cli.rollout_options import RolloutArgs
from edgesdk.errors import UsageError
from edgesdk.protocol.signing import (
    Unverified,
    canonical_json,
    check_deployment,
    command_payload,
    sign_deployment,
)
from edgesdk.schemas.messages import Deployment, HealthCriteria
from tests.ota_helpers import command_fields


def deployment(health: HealthCriteria) -> Deployment:
    return Deployment(
        deployment_id="d-1",
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256="0" * 64,
        bundle_size=1,
        chunk_size=1,
        health=health,
        **command_fields(),
    )


def test_unused_shadow_fields_are_not_on_the_wire_nor_signed() -> None:
    plain = deployment(HealthCriteria(probation_s=5))
    wire = json.loads(command_payload(plain))
    assert set(wire["health"]) == {
        "probation_s",
        "max_error_rate",
        "p95_latency_ms",
        "max_restarts",
        "max_output_drift",
    }
    assert b"min_agreement" not in canonical_json(plain) and b"shadow_rate" not in canonical_json(plain)


def test_min_agreement_is_signed_and_survives_the_wire() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    signed = sign_deployment(deployment(HealthCriteria(min_agreement=0.95, shadow_rate=0.25)), key)
    received = Deployment.model_validate_json(command_payload(signed))
    assert (received.health.min_agreement, received.health.shadow_rate) == (0.95, 0.25)
    assert isinstance(check_deployment(received, [key.public_key()]), str)  # the signer's key id
    lowered = received.model_copy(update={"health": HealthCriteria(min_agreement=0.5, shadow_rate=0.25)})
    assert isinstance(check_deployment(lowered, [key.public_key()]), Unverified)  # a changed minimum: refused


def test_min_agreement_with_shadow_rate_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="min_agreement needs a shadow_rate above 0"):
        HealthCriteria(min_agreement=0.9, shadow_rate=0)


def rollout(**given: object) -> RolloutArgs:
    values = {f.name: None for f in fields(RolloutArgs)}
    values.update(
        devices="dev-1", canary="10%", waves="100%", max_failures="0%", probation="1m", max_error_rate="1%",
        artifact_urls=(), mqtt_fallback=True, expires="1h",
    )  # fmt: skip
    values.update(given)
    return RolloutArgs(**values)  # type: ignore[arg-type]


def test_fleet_push_min_agreement_and_shadow_rate_reach_the_health_and_the_rest_body() -> None:
    args = rollout(min_agreement="0.95", shadow_rate="10%")
    health = args.health(args.plan())
    assert (health.min_agreement, health.shadow_rate) == (0.95, 0.1)
    body = args.api_body()
    assert (body["min_agreement"], body["shadow_rate"]) == (0.95, 0.1)
    assert "min_agreement" not in rollout().api_body()
    assert rollout(min_agreement="90%").health(rollout().plan()).min_agreement == 0.9


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"min_agreement": "1.5"}, "bad --min-agreement '1.5': expected a fraction between 0 and 1"),
        ({"min_agreement": "nan"}, "bad --min-agreement 'nan'"),
        ({"shadow_rate": "200%"}, "bad --shadow-rate '200%'"),
        ({"min_agreement": "0.9", "shadow_rate": "0%"}, "--min-agreement needs a --shadow-rate above 0%"),
    ],
)
def test_fleet_push_bad_shadow_options_are_one_clear_line(given: dict[str, str], needle: str) -> None:
    args = rollout(**given)
    with pytest.raises(UsageError) as caught:
        args.health(args.plan())
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_rest_and_dashboard_take_min_agreement() -> None:
    from edgesdk.fleet.service.rest.schemas import DeploymentCreate
    from edgesdk.fleet.service.rollout_form import plan_from

    body = DeploymentCreate(bundle_id="b", devices=["dev-1"], min_agreement=0.95, shadow_rate=0.2)
    assert (body.min_agreement, body.shadow_rate) == (0.95, 0.2)
    with pytest.raises(ValueError, match="min_agreement needs a shadow_rate above 0"):
        DeploymentCreate(bundle_id="b", devices=["dev-1"], min_agreement=0.95, shadow_rate=0)
    _, health, _, _ = plan_from({"target": "line-1", "min_agreement": "95%"})
    assert health.min_agreement == 0.95
