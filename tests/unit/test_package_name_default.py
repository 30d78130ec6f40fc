"""``edgesdk package`` and ``edgesdk.package`` name the bundle after the report's model when no
name is given, as docs/python-api.md says; a report name a bundle cannot carry asks for one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.bundle import inspect_bundle
from tests.bundle_helpers import KeySet, make_keys, write_convert_dir
from tests.conftest import assert_one_line_error


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KeySet]:
    root = tmp_path_factory.mktemp("package-name")
    convert = write_convert_dir(
        root / "convert",
        {"onnx-fp32": {"model.onnx": os.urandom(2_000)}},
        golden={"image": np.zeros((2, 1, 8, 8), np.float32)},
    )
    return convert, make_keys(root / "keys")


def _package_args(convert: Path, keys: KeySet, out: Path) -> list[str]:
    return [
        "package", str(convert), "--version", "1.0.0", "--publisher-key", str(keys.publisher_key),
        "--recipient", str(keys.device_pub), "--out", str(out), "--json",
    ]  # fmt: skip


def test_cli_names_the_bundle_after_the_report(made, edgesdk_cli, tmp_path: Path) -> None:
    convert, keys = made
    proc = edgesdk_cli(*_package_args(convert, keys, tmp_path / "b.edgepkg"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "digits"


def test_python_api_names_the_bundle_after_the_report(made, tmp_path: Path) -> None:
    convert, keys = made
    path = edgesdk.package(
        convert,
        out=tmp_path / "b.edgepkg",
        version="1.0.0",
        publisher_key=keys.publisher_key,
        recipients=keys.device_pub,
    )
    assert inspect_bundle(path).manifest.model.name == "digits"


def test_a_report_name_no_bundle_can_carry_asks_for_a_name(made, edgesdk_cli, tmp_path: Path) -> None:
    convert, keys = made
    odd = tmp_path / "convert"
    odd.mkdir()
    for item in convert.iterdir():  # the same dir, its report naming the model after a file stem
        (odd / item.name).symlink_to(item)
    report = json.loads((convert / "report.json").read_text())
    (odd / "report.json").unlink()
    (odd / "report.json").write_text(json.dumps({**report, "model_name": "MobileNet V2"}))
    proc = edgesdk_cli(*_package_args(odd, keys, tmp_path / "b.edgepkg"))
    assert_one_line_error(proc, "'MobileNet V2'", "--name mobilenet-v2")
    assert proc.returncode == 1
    assert not (tmp_path / "b.edgepkg").exists()
