"""Every example in examples/ runs for real (small-input modes where they have one) and does
what its README row says. The digits model comes from the session cache (DIGITS_DIR)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import require_mosquitto
from tests.integration.test_demo import wait_gone

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent


def example_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_")}
    env.pop("CI", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    return {**env, **extra}


def run_example(script: Path, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_embedded_developer_converts_and_packages_mobilenet(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("skimage", reason="MobileNetV2 photos come from scikit-image (pip install 'edgesdk[dev]')")
    from edgesdk.errors import ModelError
    from edgesdk.workloads.mobilenet import weights_bytes

    try:
        weights_bytes()
    except ModelError as exc:
        pytest.skip(str(exc))
    from edgesdk.bundle import decrypt_variant, verify_bundle
    from edgesdk.keys import load_device_private_key, load_publisher_public_key
    from edgesdk.schemas.report import ConversionReport

    out = tmp_path / "out"
    proc = run_example(
        EXAMPLES / "embedded_developer" / "convert_and_package.sh", "--quick", str(out), env=example_env(), timeout=900
    )
    assert proc.stdout.count("VERIFIED") == 2
    publisher = load_publisher_public_key(out / "keys" / "publisher" / "publisher.pub")
    for profile in ("rpi5-8gb", "jetson-orin-nano-8gb"):
        report = ConversionReport.model_validate_json((out / f"convert-{profile}" / "report.json").read_text())
        assert report.profile == profile
        assert {v.precision.value for v in report.variants} == {"fp32", "fp16"}
        assert all(v.accuracy is not None and v.accuracy.passed for v in report.variants)
        assert (out / f"convert-{profile}" / "report.html").is_file()
        bundle = verify_bundle(out / f"mobilenet-v2-{profile}.edgepkg", trusted_publishers=[publisher], profile=profile)
        assert bundle.manifest.model.name == "mobilenet-v2"
        files = decrypt_variant(bundle, "onnx-fp16", load_device_private_key(out / "keys" / profile / "device.key"))
        assert len(files["model.onnx"]) > 1_000_000  # the real network, in memory
    # A bundle is for its own device only: the Pi's key cannot open the Jetson's bundle.
    from edgesdk.errors import BundleError

    jetson = verify_bundle(out / "mobilenet-v2-jetson-orin-nano-8gb.edgepkg", trusted_publishers=[publisher])
    with pytest.raises(BundleError):
        decrypt_variant(jetson, "onnx-fp32", load_device_private_key(out / "keys" / "rpi5-8gb" / "device.key"))


def test_embedded_developer_scripts_convert_and_package_in_python(tmp_path: Path, digits) -> None:
    # The Python API version: edgesdk.convert / package / verify_bundle on the digits CNN.
    pytest.importorskip("onnxruntime")
    from edgesdk.bundle import decrypt_variant, verify_bundle
    from edgesdk.keys import load_device_private_key
    from edgesdk.schemas.report import ConversionReport

    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "embedded_developer" / "convert_and_package.py"), str(out)],
        capture_output=True,
        text=True,
        env=example_env(DIGITS_DIR=str(digits.directory)),
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "VERIFIED digits 1.0.0" in proc.stdout and "decryption + plaintext hashes" in proc.stdout
    report = ConversionReport.model_validate_json((out / "convert" / "report.json").read_text())
    assert report.profile == "rpi5-8gb" and {v.id for v in report.variants} <= {"onnx-fp32", "onnx-int8"}
    assert all(v.accuracy is not None and v.accuracy.passed for v in report.variants)
    bundle = verify_bundle(
        out / "digits-1.0.0.edgepkg", trusted_publishers=[out / "keys" / "publisher" / "publisher.pub"]
    )
    assert bundle.manifest.model.release == 1 and bundle.manifest.expires is not None
    files = decrypt_variant(bundle, "onnx-fp32", load_device_private_key(out / "keys" / "device" / "device.key"))
    assert files["model.onnx"] == (out / "convert" / "artifacts" / "onnx-fp32" / "model.onnx").read_bytes()


@pytest.mark.needs_agent_extra
def test_embedded_developer_ships_a_prebuilt_tflite_as_is_and_serves_it(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert", reason="the .tflite is validated and served in LiteRT (edgesdk[litert])")
    from tests.prebuilt_models import WAKEWORD, extract

    model = extract(WAKEWORD, "okay_nabu.tflite", tmp_path / "model")  # skips without the wheel
    out = tmp_path / "out"
    proc = run_example(
        EXAMPLES / "embedded_developer" / "tflite_as_is.sh", str(out), env=example_env(MODEL=str(model)), timeout=600
    )
    assert "tflite-int8: loaded" in proc.stdout
    served = proc.stdout.split("SERVED okay_nabu: ")[1].split()
    assert served[0] == "40" and int(served[2]) > 0, proc.stdout  # chunks, and some answers not zero
    report = json.loads((out / "convert" / "report.json").read_text())
    assert [v["id"] for v in report["variants"]] == ["tflite-int8"]


def test_embedded_developer_ships_a_keyword_spotter_that_answers_a_wav(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert", reason="the spotter is validated and served in LiteRT (edgesdk[litert])")
    from tests.prebuilt_models import WAKEWORD, extract

    model = extract(WAKEWORD, "okay_nabu.tflite", tmp_path / "model")  # skips without the wheel
    script = EXAMPLES / "embedded_developer" / "keyword_spotter.sh"
    proc = run_example(script, str(tmp_path / "out"), env=example_env(MODEL=str(model)), timeout=600)
    assert "keyword_spotter_okay_nabu.wav: agent: detected=True" in proc.stdout, proc.stdout
    assert "keyword_spotter_weather.wav: agent: detected=False" in proc.stdout, proc.stdout
    assert "SPOTTED okay nabu" in proc.stdout


@pytest.mark.needs_agent_extra
def test_embedded_developer_validates_a_pipeline_against_their_function_and_sends_a_jpeg(
    tmp_path: Path, digits
) -> None:
    pytest.importorskip("PIL", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
    out = tmp_path / "out"
    script = EXAMPLES / "embedded_developer" / "classifier_pipeline.sh"
    proc = run_example(script, str(out), env=example_env(DIGITS_DIR=str(digits.directory)), timeout=300)
    assert proc.stdout.count("end to end: task top-1 label agreement") >= 2, proc.stdout
    assert "SAME LABEL" in proc.stdout, proc.stdout
    report = json.loads((out / "convert" / "report.json").read_text())
    assert report["end_to_end"]["files"] == 40
    assert all(v["task_accuracy"]["passed"] for v in report["variants"])


@pytest.mark.needs_agent_extra
def test_embedded_developer_streams_a_stateful_model_through_a_real_agent(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("openvino", reason="the example builds OpenVINO variants too (edgesdk[convert-openvino])")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "embedded_developer" / "streaming_model.py"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=example_env(),
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "STREAM OK" in proc.stdout and "stateful: h0 → hn fed back over streams of 12 steps" in proc.stdout
    assert proc.stdout.count("chunk ") == 12


def test_device_runs_the_agent_and_calls_the_local_api(tmp_path: Path, digits) -> None:
    pytest.importorskip("onnxruntime")
    device = tmp_path / "device"
    proc = run_example(
        EXAMPLES / "device" / "run_example.sh",
        str(device),
        env=example_env(DIGITS_DIR=str(digits.directory)),
        timeout=600,
    )
    out = proc.stdout
    assert "installed digits 1.0.0 (release 1)" in out
    # Python client (edgesdk.AgentClient, then AsyncAgentClient): accurate (client.py exits 1
    # below 90%), and a wrong dtype comes back as a typed 422 with the agent's message.
    infer_line = next(line for line in out.splitlines() if line.startswith("infer:"))
    assert "served by 1.0.0 / onnx-fp32" in infer_line
    assert "refused as expected (422): input 'image'" in out
    assert any(line.startswith("async: 4 concurrent requests") for line in out.splitlines())
    # curl: the hand-drawn zero is classified as 0.
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"outputs"' in line]
    assert answers and answers[0]["model"] == "digits", out[-3000:]
    logits = answers[0]["outputs"]["logits"][0]
    assert max(range(10), key=lambda i: logits[i]) == 0
    assert 'edgesdk_agent_inferences_total{variant="onnx-fp32"}' in out
    # The agent made its own key pair; the private half is 0600 in its data dir.
    assert oct((device / "data" / "device.key").stat().st_mode & 0o777) == "0o600"
    assert wait_gone(str(device)) == {}  # the example stopped its agent


def test_fleet_operator_enrolls_and_pushes_a_canary(tmp_path: Path, digits) -> None:
    require_mosquitto()
    pytest.importorskip("paho.mqtt")
    work = tmp_path / "fleet"
    proc = run_example(
        EXAMPLES / "fleet_operator" / "canary_rollout.sh",
        str(work),
        env=example_env(DIGITS_DIR=str(digits.directory)),
        timeout=600,
    )
    out = proc.stdout
    registry = json.loads((work / "enrollment.json").read_text())
    assert {d: e["status"] for d, e in registry["devices"].items()} == {f"lab-{i}": "approved" for i in (1, 2, 3)}
    assert "lab-v1: SUCCEEDED" in out and "lab-v2: SUCCEEDED" in out
    assert wait_gone(str(work)) == {}  # agents and broker stopped on exit

    from edgesdk.fleet.service.operator_db import open_rollout_store

    store = open_rollout_store(work / "fleet.sqlite3")
    rows = store.devices("lab-v2")
    assert sorted(r.wave for r in rows) == [0, 1, 1]  # one canary, then the other two
    assert {r.state for r in rows} == {"COMMITTED"} and {r.model_release for r in rows} == {2}
    # The bundles were encrypted to exactly the approved keys.
    from edgesdk.bundle import inspect_bundle

    slots = inspect_bundle(work / "digits-v2.edgepkg").manifest.encryption.key_slots
    assert sorted(s.recipient for s in slots) == sorted(e["key_id"] for e in registry["devices"].values())
