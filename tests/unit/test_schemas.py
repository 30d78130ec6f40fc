from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from edgesdk.cli.schema_cmd import export_schemas
from edgesdk.errors import SchemaError
from edgesdk.schemas import EXPORTED_SCHEMAS, AgentConfig, BundleManifest, Telemetry

SHA = "ab" * 32


def manifest_data(**overrides: object) -> dict:
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    variant = {
        "id": "onnx-int8",
        "format": "onnx",
        "precision": "int8",
        "runtime": "onnxruntime",
        "payload": "onnx-int8.bin",
        "size": 10,
        "sha256": SHA,
        "encrypted_size": 26,
        "encrypted_sha256": SHA,
        "inputs": [
            {
                "name": "image",
                "dtype": "int8",
                "shape": ["batch", 1, 8, 8],
                "quantization": {"scale": [0.0039], "zero_point": [-128]},
            }
        ],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
    }
    data = {
        "model": {"name": "digits", "version": "1.2.0", "release": 3},
        "publisher": {"name": "acme", "key_id": "0123456789abcdef"},
        "created": now.isoformat(),
        "expires": (now + timedelta(days=90)).isoformat(),
        "targets": ["rpi5-8gb"],
        "variants": [variant],
    }
    data.update(overrides)
    return data


def test_manifest_round_trips_through_json() -> None:
    manifest = BundleManifest.model_validate(manifest_data())
    again = BundleManifest.model_validate_json(manifest.model_dump_json())
    assert again == manifest
    assert manifest.variant("onnx-int8").inputs[0].quantization.zero_point == [-128]


def test_documents_are_frozen_and_strict() -> None:
    manifest = BundleManifest.model_validate(manifest_data())
    with pytest.raises(ValidationError):
        manifest.model.release = 4  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        BundleManifest.model_validate(manifest_data(surprise=True))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("model", {"name": "digits", "version": "1.2", "release": 1}, "model.version"),
        ("model", {"name": "digits", "version": "1.2.0", "release": 0}, "model.release"),
        ("targets", [], "targets"),
        ("expires", "2020-01-01T00:00:00Z", "expires must be after created"),
    ],
)
def test_bad_manifest_fields_are_named(field: str, value: object, needle: str) -> None:
    with pytest.raises(SchemaError, match=needle):
        BundleManifest.parse_obj_clear(manifest_data(**{field: value}), source="manifest")


def test_payload_names_cannot_traverse_paths() -> None:
    data = manifest_data()
    data["variants"][0]["payload"] = "../../etc/passwd"
    with pytest.raises(SchemaError, match="payload"):
        BundleManifest.parse_obj_clear(data, source="manifest")


def test_newer_schema_version_is_refused() -> None:
    with pytest.raises(SchemaError, match="schema_version"):
        BundleManifest.parse_obj_clear(manifest_data(schema_version=2), source="manifest")


def test_parse_json_clear_reports_bad_json() -> None:
    with pytest.raises(SchemaError, match="not valid JSON"):
        Telemetry.parse_json_clear(b"{nope", source="devices/x/telemetry")


def test_agent_config_defaults_are_loopback() -> None:
    config = AgentConfig(device_id="pi-01", profile="rpi5-8gb")
    assert config.api.host == "127.0.0.1"
    assert config.mqtt.enabled is False


def test_schema_export_writes_valid_json_schema(tmp_path) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the exported documents")
    written = export_schemas(tmp_path)
    assert {p.name for p in written} == {f"{n}.schema.json" for n in EXPORTED_SCHEMAS}
    for path in written:
        document = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(document)
    manifest_schema = json.loads((tmp_path / "bundle-manifest.schema.json").read_text())
    jsonschema.Draft202012Validator(manifest_schema).validate(
        json.loads(BundleManifest.model_validate(manifest_data()).model_dump_json())
    )
    bad = manifest_data()
    bad["variants"][0]["precision"] = "fp7"
    assert list(jsonschema.Draft202012Validator(manifest_schema).iter_errors(bad))


def test_ota_state_accepts_exactly_the_update_machine_states() -> None:
    # OtaState is derived from the enum the device's update machine walks: the exported schema
    # lists its values in order, every value validates and anything else is refused.
    from edgesdk.protocol.ota import UpdateState
    from edgesdk.schemas.messages import OtaStatus

    names = [state.value for state in UpdateState]
    assert OtaStatus.model_json_schema()["properties"]["state"] == {"enum": names, "title": "State", "type": "string"}
    base = {"device_id": "d", "deployment_id": "x", "msg_id": "m", "ts": "2024-01-01T00:00:00Z"}
    for name in names:
        assert OtaStatus.model_validate({**base, "state": name}).state == name
    with pytest.raises(ValidationError):
        OtaStatus.model_validate({**base, "state": "INSTALLING"})
