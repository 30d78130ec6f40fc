"""Bounds on a signed command's numbers (issue 37, findings 7 and 9): the device's sequence ceiling
and validity cap (agent/ota/freshness.py), and the same cap where commands are asked for — the
REST request models and ``--expires``. Through real processes: tests/integration/
test_ota_command_bounds_agent.py (agent) and test_fleet_api_fuzz.py (fleet service)."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from edgesdk.agent.ota.freshness import (
    SEQUENCE_LEAD_S,
    Admission,
    CommandGate,
    CommandRefused,
    SequenceLedger,
    sequence_ceiling,
)

from edgesdk.errors import SchemaError, UsageError
from edgesdk.schemas.messages import MAX_COMMAND_VALIDITY_S, Deployment

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
NOW_MS = int(NOW.timestamp() * 1000)
SKEW_S = 300.0


def command(sequence: int, *, valid_s: float = 3600.0, deployment_id: str = "dep-1") -> Deployment:
    return Deployment.model_validate(
        {
            "deployment_id": deployment_id,
            "issued_at": NOW - timedelta(minutes=1),
            "expires_at": NOW - timedelta(minutes=1) + timedelta(seconds=valid_s),
            "sequence": sequence,
            "targets": ["dev-1"],
            "model_name": "digits",
            "model_version": "1.1.0",
            "release": 2,
            "bundle_sha256": hashlib.sha256(b"x").hexdigest(),
            "bundle_size": 1,
            "signature": f"ed25519:key:{sequence}-{valid_s}",
        }
    )


def gate(tmp_path: Path, **kwargs: object) -> CommandGate:
    options: dict = {"device_id": "dev-1", "clock_skew_s": SKEW_S} | kwargs
    return CommandGate(SequenceLedger(tmp_path / "command_sequence.json"), **options)


def refused(the_gate: CommandGate, message: Deployment) -> CommandRefused:
    with pytest.raises(CommandRefused) as caught:
        the_gate.admit(message, "key", now=NOW)
    return caught.value


def test_the_sequence_ceiling_is_the_device_clock_in_ms_plus_skew_and_lead() -> None:
    assert sequence_ceiling(NOW, timedelta(seconds=SKEW_S)) == NOW_MS + int((SKEW_S + SEQUENCE_LEAD_S) * 1000)


def test_a_sequence_above_the_ceiling_is_refused_and_consumes_nothing(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    ceiling = sequence_ceiling(NOW, the_gate.clock_skew)
    error = refused(the_gate, command(10**30))
    assert error.why == "sequence_ahead"
    assert "sequence ahead of time" in str(error) and "about 2**99" in str(error) and str(ceiling) in str(error)
    assert refused(the_gate, command(ceiling + 1)).why == "sequence_ahead"
    assert the_gate.ledger.last("key") == 0  # refused: the key's window did not move
    # The fleet's own numbers (the time in ms, or a legacy small counter) pass, up to the ceiling.
    assert the_gate.admit(command(7), "key", now=NOW) is Admission.ACT
    assert the_gate.admit(command(NOW_MS, deployment_id="dep-2"), "key", now=NOW) is Admission.ACT
    assert the_gate.admit(command(ceiling, deployment_id="dep-3"), "key", now=NOW) is Admission.ACT


def test_a_sequence_at_the_ceiling_holds_the_key_back_at_most_the_lead(tmp_path: Path) -> None:
    """The worst one bad signed sequence can do now: the fleet's later numbers (its clock in ms)
    are replays until its clock passes it — the skew and an hour later, no more."""
    the_gate = gate(tmp_path)
    ceiling = sequence_ceiling(NOW, the_gate.clock_skew)
    assert the_gate.admit(command(ceiling), "key", now=NOW) is Admission.ACT
    assert refused(the_gate, command(NOW_MS + 60_000, deployment_id="dep-2")).why == "replay"
    later = NOW + timedelta(seconds=SKEW_S + SEQUENCE_LEAD_S + 1)
    fleet_sequence = int(later.timestamp() * 1000)
    fresh = command(fleet_sequence, deployment_id="dep-3").model_copy(
        update={"issued_at": later - timedelta(seconds=1), "expires_at": later + timedelta(hours=1)}
    )
    assert the_gate.admit(fresh, "key", now=later) is Admission.ACT


def test_validity_is_capped_at_a_week_by_default(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    assert the_gate.max_validity == timedelta(seconds=MAX_COMMAND_VALIDITY_S) == timedelta(days=7)
    error = refused(the_gate, command(1, valid_s=3e9))
    assert error.why == "validity_too_long"
    assert "valid for 3e+09 s" in str(error) and "at most 604800 s ([ota] max_command_validity_s)" in str(error)
    assert refused(the_gate, command(2, valid_s=MAX_COMMAND_VALIDITY_S + 1)).why == "validity_too_long"
    assert the_gate.admit(command(3, valid_s=MAX_COMMAND_VALIDITY_S), "key", now=NOW) is Admission.ACT


def test_a_configured_cap_applies(tmp_path: Path) -> None:
    the_gate = gate(tmp_path, max_validity_s=3600)
    assert refused(the_gate, command(1, valid_s=3601)).why == "validity_too_long"
    assert the_gate.admit(command(2, valid_s=3600), "key", now=NOW) is Admission.ACT


def test_the_cap_is_an_agent_config_option_with_bounds() -> None:
    from edgesdk.schemas.agent_config import AgentConfig

    base = {"device_id": "dev-1", "profile": "rpi5-8gb"}
    assert AgentConfig.model_validate(base).ota.max_command_validity_s == 7 * 86400
    configured = AgentConfig.model_validate({**base, "ota": {"max_command_validity_s": 3600}})
    assert configured.ota.max_command_validity_s == 3600
    for bad in (0, -1, 31 * 86400):
        with pytest.raises(SchemaError, match="max_command_validity_s"):
            AgentConfig.parse_obj_clear({**base, "ota": {"max_command_validity_s": bad}}, source="agent config")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expires_s", 3e9),
        ("expires_s", 1e300),
        ("expires_s", 5e-324),  # rounds to no lifetime at all: the command could not be built (a 500)
        ("expires_s", math.nan),
        ("probation_s", math.inf),
        ("probation_s", 1e300),
        ("wave_timeout_s", 1e300),
        ("p95_ms", 1e300),
        ("canary", math.nan),
        ("waves", [math.nan]),
        ("waves", [1.0] * 101),
        ("chunk_size", 10**30),
    ],
)
def test_the_rest_rollout_body_refuses_absurd_numbers(field: str, value: object) -> None:
    pytest.importorskip("fastapi", reason="needs the fleet-service extra")
    from pydantic import ValidationError

    from edgesdk.fleet.service.rest.schemas import CommandOptions, DeploymentCreate

    with pytest.raises(ValidationError, match=field):
        DeploymentCreate.model_validate({"bundle_id": "b", "group": "g", field: value})
    if field == "expires_s":
        with pytest.raises(ValidationError, match=field):
            CommandOptions.model_validate({field: value})
    week = DeploymentCreate.model_validate({"bundle_id": "b", "group": "g", "expires_s": 7 * 86400.0})
    assert week.expires_s == MAX_COMMAND_VALIDITY_S


@pytest.mark.parametrize(("text", "needle"), [("8d", "at most 7 days"), ("500ms", "at least 1 s"), ("0", "at least")])
def test_expires_option_refuses_beyond_the_cap(text: str, needle: str) -> None:
    from edgesdk.cli.rollout_options import positive_duration

    with pytest.raises(UsageError, match=needle):
        positive_duration(text)
    assert positive_duration("7d") == MAX_COMMAND_VALIDITY_S
    assert positive_duration("6h") == 6 * 3600


def test_fleet_abort_with_a_month_of_validity_is_one_error_line(tmp_path: Path, edgesdk_cli) -> None:
    from tests.conftest import assert_one_line_error

    token = tmp_path / "token"
    token.write_text("esf_unused\n")
    proc = edgesdk_cli(
        "fleet", "abort", "dep-1", "--expires", "30d", "--server", "http://127.0.0.1:9", "--token-file", str(token),
        timeout=60,
    )  # fmt: skip
    assert_one_line_error(proc, "--expires '30d'", "at most 7 days")


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        (["--probation", "40d"], "bad --probation '40d': at most 30 days"),  # all accepted before
        (["--wave-timeout", "31d"], "bad --wave-timeout '31d'"),
        (["--p95-ms", "inf"], "bad --p95-ms inf"),  # click reads inf and nan as floats
        (["--p95-ms", "nan"], "bad --p95-ms nan"),
        (["--chunk-size", "0"], "bad --chunk-size 0"),
        (["--expires", "8d"], "bad --expires '8d': at most 7 days"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_fleet_push_with_an_absurd_number_is_one_error_line(
    tmp_path: Path, edgesdk_cli, option: list[str], needle: str
) -> None:
    from edgesdk.bundle import package_bundle
    from edgesdk.keys import generate_publisher_key
    from tests.bundle_helpers import make_keys, write_convert_dir
    from tests.conftest import assert_one_line_error

    keys = make_keys(tmp_path / "keys")
    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": b"\0" * 256}})
    bundle = package_bundle(
        convert, name="digits", version="1.0.0", release=1, publisher_key=keys.publisher_key,
        recipients=[keys.device_pub], out=tmp_path / "d.edgepkg",
    )  # fmt: skip
    operator_key, _ = generate_publisher_key(tmp_path / "operator")
    proc = edgesdk_cli(
        "fleet", "push", str(bundle), "--devices", "dev-1", *option, "--broker", "mqtt://127.0.0.1:9",
        "--operator-key", str(operator_key), "--db", str(tmp_path / "fleet.sqlite3"), timeout=60,
    )  # fmt: skip
    assert_one_line_error(proc, needle)


def test_health_criteria_numbers_are_finite_and_bounded() -> None:
    """An Infinity in a command's health was written as ``null`` into the signed message (the
    dashboard's form reads "inf" as a float), which no device nor later read could parse."""
    from edgesdk.schemas.messages import MAX_PROBATION_S, HealthCriteria

    for fields in ({"probation_s": math.inf}, {"probation_s": MAX_PROBATION_S + 1}, {"p95_latency_ms": math.nan}):
        with pytest.raises(ValueError, match="probation_s|p95_latency_ms"):
            HealthCriteria.model_validate(fields)
    assert HealthCriteria(probation_s=MAX_PROBATION_S).probation_s == 30 * 86400
