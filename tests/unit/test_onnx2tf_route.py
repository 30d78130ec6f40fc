"""The onnx2tf route without the toolchain: its command line, its missing-toolchain reason, its failures."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters import onnx2tf_route
from edgesdk.converters.planner import make_plan
from edgesdk.converters.registry import missing_packages

from edgesdk.errors import ConversionError
from edgesdk.profiles import get_profile
from edgesdk.schemas.common import ModelFormat, RuntimeName
from edgesdk.schemas.manifest import TensorSpec

ALL_HOST_RUNTIMES = tuple(RuntimeName)


def _fake_onnx2tf(folder: Path, body: str) -> Path:
    exe = folder / "bin" / "onnx2tf"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_command_line_fixes_shapes_to_the_example_and_keeps_nchw() -> None:
    inputs = [
        TensorSpec(name="image", dtype="float32", shape=["batch", 1, 8, 8]),
        TensorSpec(name="ids", dtype="int64", shape=["batch", "seq"]),
    ]
    example = {"image": np.zeros((1, 1, 8, 8), np.float32), "ids": np.zeros((1, 16), np.int64)}
    command = onnx2tf_route.command_line(Path("/venv/bin/onnx2tf"), Path("/t/m.onnx"), Path("/t/out"), inputs, example)
    assert command == [
        "/venv/bin/onnx2tf", "-i", "/t/m.onnx", "-o", "/t/out", "-rtpo", "Erf",
        "-k", "image",
        "-ois", "image:1,1,8,8", "ids:1,16",
    ]  # fmt: skip


def test_missing_toolchain_is_a_planner_rejection_that_says_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(onnx2tf_route.ENV_VAR, str(tmp_path / "no-venv"))
    monkeypatch.setenv("EDGESDK_ONNX2TORCH", "0")  # the light route off: onnx2tf is the only one left
    plan = make_plan(get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert not any(v.format == ModelFormat.TFLITE for v in plan.variants)
    reasons = [r.reason for r in plan.rejected if r.format == ModelFormat.TFLITE]
    assert len(reasons) == 3
    assert all("onnx2tf" in r and "python -m edgesdk.converters.onnx2tf_install" in r for r in reasons)
    assert all(str(tmp_path / "no-venv") in r and "\n" not in r for r in reasons)


def test_installed_toolchain_plans_tflite_for_an_onnx_file(monkeypatch, tmp_path) -> None:
    # onnx2tf is faked, but the planner also wants the tflite converter's own packages.
    missing = missing_packages("tflite", "onnx")
    if missing:
        pytest.skip(f"the tflite converter needs {missing} (pip install 'edgesdk[convert-tflite]')")
    monkeypatch.setenv(onnx2tf_route.ENV_VAR, str(tmp_path / "venv"))
    _fake_onnx2tf(tmp_path / "venv", "exit 0")
    plan = make_plan(get_profile("rpi5-8gb"), "onnx", has_calibration=True, host_runtimes=ALL_HOST_RUNTIMES)
    assert {v.precision.value for v in plan.variants if v.format == ModelFormat.TFLITE} == {"fp32", "fp16", "int8"}


def _convert(tmp_path: Path) -> bytes:
    source = tmp_path / "user.onnx"
    source.write_bytes(b"original")
    inputs = [TensorSpec(name="image", dtype="float32", shape=["batch", 1, 8, 8])]
    return onnx2tf_route.convert_onnx(source, inputs, {"image": np.zeros((1, 1, 8, 8), np.float32)}, where="user.onnx")


def test_exit_0_without_output_is_a_conversion_error_with_the_log_tail(monkeypatch, tmp_path) -> None:
    # What onnx2tf does when onnxsim is not on PATH: logs the error, exits 0, writes nothing.
    monkeypatch.setenv(onnx2tf_route.ENV_VAR, str(tmp_path / "venv"))
    _fake_onnx2tf(
        tmp_path / "venv", "echo \"FileNotFoundError: [Errno 2] No such file or directory: 'onnxsim'\"; exit 0"
    )
    with pytest.raises(ConversionError, match="no model_float32.tflite written.*onnxsim"):
        _convert(tmp_path)


def test_the_subprocess_gets_a_copy_and_its_venv_bin_first_on_path(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(onnx2tf_route.ENV_VAR, str(tmp_path / "venv"))
    bin_dir = tmp_path / "venv" / "bin"
    # Overwrites its input like onnxsim does, and writes PATH's first entry as the "model".
    _fake_onnx2tf(
        tmp_path / "venv",
        'echo simplified > "$2"; mkdir -p "$4"; printf %s "${PATH%%:*}" > "$4/model_float32.tflite"',
    )
    assert _convert(tmp_path) == str(bin_dir).encode()
    assert (tmp_path / "user.onnx").read_bytes() == b"original"


def test_a_failing_run_names_the_failure(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(onnx2tf_route.ENV_VAR, str(tmp_path / "venv"))
    _fake_onnx2tf(tmp_path / "venv", "echo 'ERROR: The trace log is below. op_type: NonMaxSuppression'; exit 1")
    with pytest.raises(ConversionError, match="exit 1.*NonMaxSuppression"):
        _convert(tmp_path)


def test_installer_failure_is_one_error_line(tmp_path, capsys) -> None:
    from edgesdk.converters import onnx2tf_install

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert onnx2tf_install.main([str(blocker / "venv")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: installing the onnx2tf toolchain failed")
