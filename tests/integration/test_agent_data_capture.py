"""Sampled data capture through a real ``edge-agent run`` (issue 41): with ``[capture] rate = 1.0``
every answered request is written under the data dir, encrypted to the operator's key. The files
hold no plaintext input, open only with the operator's key, and decrypt to exactly what was served;
a full disk budget deletes the oldest files and the agent keeps answering."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgesdk.capture.operator_key import generate_capture_key
from edgesdk.capture.record import unpack_record
from edgesdk.capture.sealed import CaptureFileError, open_sealed
from edgesdk.keys import load_device_private_key
from tests.agent_helpers import AgentProcess, make_device, run_agent_cli
from tests.conftest import assert_one_line_error

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")

REQUESTS = 8
#: About three files of one 8x8 image each (~1.6 KB sealed): the budget fills and the oldest go.
BUDGET_MB = 0.005


def _files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "capture").glob("*.edgecap"))


def _ask(client: httpx.Client, image: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    np.savez(buffer, image=image)
    answer = client.post(
        "/v1/models/digits/infer", content=buffer.getvalue(), headers={"content-type": "application/x-npz"}
    )
    assert answer.status_code == 200, answer.text
    return np.load(io.BytesIO(answer.content))["logits"]


def test_agent_capture_files_decrypt_only_with_the_operator_key_to_what_was_served(
    digits, tmp_path: Path, request
) -> None:
    from tests.bundle_helpers import make_digits_convert_dir

    cache = Path(request.config.cache.mkdir("edgesdk-agent-digits-fp32-convert-v1"))
    convert_dir = make_digits_convert_dir(digits, cache / "out", int8=False)
    operator_private, operator_public = generate_capture_key(tmp_path / "operator")
    stranger_private, _ = generate_capture_key(tmp_path / "stranger")
    device = make_device(tmp_path / "device")
    device.install(convert_dir, name="digits")

    device.write_config(capture={"rate": 1.0})  # on, but no key: refused at start in one line
    assert_one_line_error(run_agent_cli("run", "--config", str(device.config), timeout=60), "operator_public_key")

    device.write_config(capture={"rate": 1.0, "operator_public_key": str(operator_public), "max_mb": BUDGET_MB})
    images = np.load(digits.validation)["image"][:REQUESTS].astype(np.float32)
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=30) as client:
        served = [_ask(client, image[None]) for image in images]  # the budget fills after ~3
        key = load_device_private_key(operator_private)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the writer thread catches up with the last answer
            files = _files(device.data_dir)
            last = unpack_record(open_sealed(files[-1].read_bytes(), key, source="f"), source="f") if files else None
            if last is not None and np.array_equal(last.inputs["image"], images[-1:]):
                break
            time.sleep(0.1)
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()

    files = _files(device.data_dir)
    assert 1 <= len(files) < REQUESTS, files  # the oldest were deleted for the budget
    assert sum(f.stat().st_size for f in files) <= BUDGET_MB * 1024 * 1024
    for offset, path in enumerate(files, start=REQUESTS - len(files)):
        data = path.read_bytes()
        assert images[offset].tobytes() not in data and served[offset].tobytes() not in data
        record = unpack_record(open_sealed(data, key, source=path.name), source=path.name)
        np.testing.assert_array_equal(record.inputs["image"], images[offset : offset + 1])
        np.testing.assert_array_equal(record.outputs["logits"], served[offset])
        assert record.meta["model"] == "digits" and record.meta["release"] == 1 and record.meta["device_id"] == "dev-1"
        with pytest.raises(CaptureFileError):
            open_sealed(data, load_device_private_key(stranger_private), source=path.name)

    cli = [sys.executable, "-m", "edgesdk.cli.main", "capture", "decrypt", str(files[-1]), "--json"]
    opened = subprocess.run(
        [*cli, "--operator-key", str(operator_private), "--out", str(tmp_path / "plain")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert opened.returncode == 0, opened.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "plain" / f"{files[-1].stem}.npz")["in/image"], images[-1:])
    refused = subprocess.run(
        [*cli, "--operator-key", str(stranger_private)], capture_output=True, text=True, timeout=60
    )
    assert_one_line_error(refused, files[-1].name, "not to this key")
