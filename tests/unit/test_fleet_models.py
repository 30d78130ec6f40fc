"""``--model`` of ``edgesdk fleet push / status / rollback`` (edgesdk/cli/fleet_models.py): the
bundle must be the model named, listings keep to it, rollback finds its latest deployment, and
every misuse is one clear line."""

from __future__ import annotations

import os

import pytest

from edgesdk.cli.fleet_models import check_bundle_model, keep_model, latest_of_model, model_of, per_model_rows
from edgesdk.errors import UsageError
from tests.bundle_helpers import make_keys, write_convert_dir
from tests.conftest import assert_one_line_error

ROWS = [
    {"deployment_id": "d1", "state": "SUCCEEDED", "model": "digits 1.0.0 (release 1)", "by_state": {"COMMITTED": 2}},
    {"deployment_id": "k1", "state": "ROLLED_BACK", "model_name": "kws", "model": "kws 1.0.0", "by_state": {}},
    {
        "deployment_id": "d2",
        "state": "RUNNING",
        "model_name": "digits",
        "model": "digits 1.1.0",
        "by_state": {"SENT": 1},
    },
]


def test_rows_are_kept_to_a_model_and_its_latest_deployment_found() -> None:
    assert [model_of(r) for r in ROWS] == ["digits", "kws", "digits"]  # older summaries: from "model"
    assert [r["deployment_id"] for r in keep_model(ROWS, "digits")] == ["d1", "d2"]
    assert keep_model(ROWS, None) == ROWS
    assert latest_of_model(ROWS, "digits") == "d2"
    with pytest.raises(UsageError, match="'wakeword': no deployment"):
        latest_of_model(ROWS, "wakeword")
    assert per_model_rows(ROWS) == [("digits", "d2", "RUNNING", "SENT 1"), ("kws", "k1", "ROLLED_BACK", "")]


def test_push_refuses_a_bundle_of_another_model(tmp_path, edgesdk_cli) -> None:
    from edgesdk.bundle import package_bundle

    keys = make_keys(tmp_path / "keys")
    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": os.urandom(2048)}})
    bundle = package_bundle(
        convert,
        name="digits",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        out=tmp_path / "digits.edgepkg",
    )
    check_bundle_model(bundle, "digits")
    with pytest.raises(UsageError, match="bundle .* is model 'digits'"):
        check_bundle_model(bundle, "kws")
    proc = edgesdk_cli(
        "fleet", "push", str(bundle), "--model", "kws", "--devices", "d", "--broker", "mqtt://127.0.0.1:1"
    )
    assert_one_line_error(proc, "--model 'kws'", "is model 'digits'")


def test_rollback_needs_a_deployment_or_a_model(tmp_path, edgesdk_cli) -> None:
    proc = edgesdk_cli("fleet", "rollback", "--db", str(tmp_path / "fleet.sqlite3"), "--broker", "mqtt://127.0.0.1:1")
    assert_one_line_error(proc, "--model NAME")
    proc = edgesdk_cli(
        "fleet", "rollback", "--model", "kws", "--db", str(tmp_path / "fleet.sqlite3"), "--broker", "mqtt://127.0.0.1:1"
    )
    assert_one_line_error(proc, "--model 'kws': no deployment of that model")
