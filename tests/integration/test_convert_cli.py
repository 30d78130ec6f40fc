"""``edgesdk convert`` end to end on the real digits CNN, in the real runtimes, as a user runs it.

The digits conversions run once per session (module fixtures) and the tests read their output.
"""

from __future__ import annotations

import base64
import json
import os
import textwrap

import numpy as np
import pytest
from edgesdk.converters.planner import onnx_to_tflite_missing

from edgesdk.schemas.report import ConversionReport
from tests.conftest import assert_one_line_error

FACTORY = textwrap.dedent(
    """
    import os

    import torch


    def digits():
        from edgesdk.workloads.digits import build_digits_cnn

        model = build_digits_cnn()
        model.load_state_dict(torch.load(os.environ["DIGITS_STATE"], weights_only=True))
        return model


    class Det(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.det(x)


    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x, dim=-1).abs()


    def det():
        return Det()


    def spectrum():
        return Spectrum()
    """
)


@pytest.fixture(scope="module")
def factory_env(digits, tmp_path_factory):
    folder = tmp_path_factory.mktemp("factory")
    (folder / "user_models.py").write_text(FACTORY)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    env["DIGITS_STATE"] = str(digits.state_dict)
    return env


@pytest.fixture(scope="module")
def rpi5_from_pytorch(edgesdk_cli_module, digits, factory_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("rpi5") / "out"
    proc = edgesdk_cli_module(
        "convert", "user_models:digits", "--profile", "rpi5-8gb", "--out", str(out),
        "--calibration", str(digits.calibration), "--validation", str(digits.validation),
        "--output-names", "logits", "--name", "digits", "--json", env=factory_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def edgesdk_cli_module():
    import subprocess
    import sys

    def invoke(*args: str, env=None, timeout: float = 600):
        return subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True, env=env, timeout=timeout
        )

    return invoke


def test_pytorch_model_to_rpi5_ships_a_validated_ladder_per_runtime(rpi5_from_pytorch) -> None:
    out, proc = rpi5_from_pytorch
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert json.loads(proc.stdout)["profile"] == "rpi5-8gb"  # --json prints the report
    shipped = {v.id: v for v in report.variants}
    for fmt in ("tflite", "onnx", "openvino"):
        for precision in ("fp32", "fp16", "int8"):
            assert f"{fmt}-{precision}" in shipped, (fmt, precision, report.rejected)
    for variant in report.variants:
        assert variant.validation == "numeric"
        assert variant.accuracy.passed and variant.accuracy.value >= 0.99
        assert variant.measurements.latency_p50_ms > 0 and variant.measurements.load_ms > 0
        assert variant.size == sum((out / f).stat().st_size for f in variant.files)
        for spec in variant.inputs:
            assert spec.name == "image"
    # TFLite int8 builds both recipes and keeps the faster that holds the gate. Which one is
    # faster on a model this small is a timing (it differs between machines), so the test only
    # holds the report to its word: the kept recipe's I/O is the shipped variant's I/O.
    tflite_int8 = shipped["tflite-int8"]
    tflite_trials = {t.method: t for t in report.recipes if t.format.value == "tflite" and t.precision.value == "int8"}
    assert set(tflite_trials) == {"static-int8-full-integer", "dynamic-int8"}
    (kept_tflite,) = [t for t in tflite_trials.values() if t.outcome == "kept"]
    assert kept_tflite.method == tflite_int8.quantization_method
    if kept_tflite.method == "static-int8-full-integer":
        assert tflite_int8.inputs[0].dtype == "int8" and tflite_int8.inputs[0].quantization is not None
    else:
        assert tflite_int8.inputs[0].dtype == "float32" and tflite_int8.inputs[0].quantization is None
    # A convnet gets the convnet recipes, each measured against the others and listed in the report.
    assert report.family == "convnet"
    assert any(d.startswith("onnx-int8: measured") and "static-qdq-percentile" in d for d in report.decisions)
    assert any(d.startswith("onnx: int8/fp32 median latency") for d in report.decisions)
    onnx_int8 = {t.method: t for t in report.recipes if t.format.value == "onnx" and t.precision.value == "int8"}
    assert {"static-qdq-per-channel", "static-qdq-percentile", "nncf-qdq"} <= set(onnx_int8)
    assert "dynamic-int8" not in onnx_int8  # ConvInteger: slower than fp32 on convnets, not a convnet recipe
    kept = [t for t in onnx_int8.values() if t.outcome == "kept"]
    assert len(kept) == 1 and kept[0].method == shipped["onnx-int8"].quantization_method
    assert all(
        t.accuracy is not None and t.size and t.latency_p50_ms for t in onnx_int8.values() if t.outcome != "failed"
    )
    # Validation is disjoint from calibration (digits: train vs test split), and 449 samples make a bound.
    assert any("disjoint" in d for d in report.decisions)
    assert shipped["onnx-fp32"].accuracy.verdict == "pass" and shipped["onnx-fp32"].accuracy.lower_bound > 0.99
    assert shipped["onnx-fp32"].ladder_role == "reference"
    assert all("unverified until measured on the device" in v.latency_basis for v in report.variants)


def test_full_integer_tflite_takes_int8_and_says_how_to_quantize(
    edgesdk_cli_module, digits, factory_env, tmp_path
) -> None:
    # Pinned to full-integer, so the I/O does not depend on which recipe measured faster here.
    out = tmp_path / "full-integer"
    proc = edgesdk_cli_module(
        "convert", "user_models:digits", "--profile", "rpi5-8gb", "--out", str(out), "--formats", "tflite",
        "--precisions", "int8", "--int8-method", "static-int8-full-integer", "--calibration", str(digits.calibration),
        "--validation", str(digits.validation), "--output-names", "logits", env=factory_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    (variant,) = report.variants
    assert variant.quantization_method == "static-int8-full-integer" and variant.accuracy.passed
    # The report carries what the packager needs to quantize inputs and dequantize outputs.
    for spec in (*variant.inputs, *variant.outputs):
        assert spec.dtype == "int8" and spec.quantization is not None and spec.quantization.scale[0] > 0


def test_output_dir_has_golden_data_and_an_html_report_with_plots(rpi5_from_pytorch, digits) -> None:
    out, _ = rpi5_from_pytorch
    golden = np.load(out / "golden.npz")
    assert set(golden.files) == {"image", "output:logits"}
    validation = np.load(digits.validation)
    np.testing.assert_array_equal(golden["image"], validation["image"][: len(golden["image"])])
    page = (out / "report.html").read_text()
    start = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    png = base64.b64decode(page[start : page.index('"', start)])
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "Planner decisions" in page
    assert not [p.name for p in out.parent.iterdir() if ".partial-" in p.name]


def test_artifacts_load_from_bytes_in_the_agent_runtimes(rpi5_from_pytorch, digits) -> None:
    from edgesdk.runtimes import load_variant

    out, _ = rpi5_from_pytorch
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    golden = np.load(out / "golden.npz")
    for variant in report.variants:
        if variant.precision.value != "fp32":
            continue
        options = {"INFERENCE_PRECISION_HINT": "f32"} if variant.runtime.value == "openvino" else None
        model = load_variant(variant.runtime.value, {f: (out / f).read_bytes() for f in variant.files}, options=options)
        got = model.run({"image": golden["image"][:1]})["logits"]
        np.testing.assert_allclose(got, golden["output:logits"][:1], atol=1e-3)


def test_onnx_file_to_rpi5_says_which_formats_it_cannot_reach(edgesdk_cli_module, digits, tmp_path) -> None:
    out = tmp_path / "onnx-out"
    proc = edgesdk_cli_module(
        "convert", str(digits.onnx), "--profile", "rpi5-8gb", "--out", str(out), "--calibration", str(digits.calibration),
        "--validation", str(digits.validation), "--precisions", "fp32,int8",
        # Neither ONNX→TFLite route: onnx2tf's venv absent, onnx2torch switched off.
        env={**os.environ, "EDGESDK_ONNX2TF": str(tmp_path / "no-onnx2tf"), "EDGESDK_ONNX2TORCH": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert {v.id for v in report.variants} == {"onnx-fp32", "onnx-int8", "openvino-fp32", "openvino-int8"}
    assert all(v.inputs[0].shape[0] == "batch" for v in report.variants if v.format.value == "onnx")
    assert {r.format.value for r in report.rejected} == {"tflite"}
    assert "rejected tflite fp32" in proc.stdout and "onnx2tf" in proc.stdout


def test_apple_profile_gets_unvalidated_coreml_packaged_only_when_allowed(
    edgesdk_cli_module, digits, factory_env, tmp_path
) -> None:
    pytest.importorskip("coremltools")
    out = tmp_path / "apple"
    proc = edgesdk_cli_module(
        "convert", "user_models:digits", "--profile", "apple-m2-mac", "--out", str(out), "--calibration",
        str(digits.calibration), "--output-names", "logits", "--formats", "coreml", "--json", env=factory_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert {v.id for v in report.variants} == {"coreml-fp32", "coreml-fp16", "coreml-int8"}
    for variant in report.variants:
        assert variant.validation == "unvalidated" and variant.accuracy is None
        assert "macOS" in variant.measurements.note
        assert variant.inputs[0].name == "image" and variant.outputs[0].dtype == "float32"
        assert all(f.startswith(f"artifacts/{variant.id}/model.mlpackage/") for f in variant.files)
    sizes = {v.precision.value: v.size for v in report.variants}
    assert sizes["int8"] < sizes["fp16"] < sizes["fp32"]
    assert all(v.ladder_role == "off" for v in report.variants)
    # Core ML honesty: never run, so packaged only when asked, and then off the governor's ladder.
    from edgesdk.keys import generate_device_key, generate_publisher_key

    publisher, _ = generate_publisher_key(tmp_path / "publisher")
    _, device_pub = generate_device_key(tmp_path / "device")
    refused = edgesdk_cli_module(
        "package", str(out), "--name", "digits", "--version", "1.0.0", "--publisher-key", str(publisher),
        "--recipient", str(device_pub), "--out", str(tmp_path / "digits.edgepkg"),
    )  # fmt: skip
    assert_one_line_error(refused, "coreml-fp32", "--allow-unvalidated")
    assert not (tmp_path / "digits.edgepkg").exists()
    allowed = edgesdk_cli_module(
        "package", str(out), "--name", "digits", "--version", "1.0.0", "--publisher-key", str(publisher),
        "--recipient", str(device_pub), "--out", str(tmp_path / "digits.edgepkg"), "--allow-unvalidated",
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    from edgesdk.bundle import inspect_bundle

    manifest = inspect_bundle(tmp_path / "digits.edgepkg").manifest
    assert {v.ladder_role for v in manifest.variants} == {"off"}


# --- bad input: one clear line, non-zero exit, nothing in --out ------------------------------------


def _bad_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("unknown-profile", ["profile 'rpi9' not found", "rpi5-8gb"]),
        ("missing-model", ["nope.onnx", "not found"]),
        ("garbage-model", ["garbage.onnx", "not a readable ONNX file"]),
        ("calibration-shape", ["calibration data", "'image'", "(4, 3, 8, 8)", "(N, 1, 8, 8)"]),
        ("calibration-dtype", ["calibration data", "'image'", "float64", "float32"]),
        ("custom-op", ["custom.onnx", "'frob'", "com.example::Frobnicate"]),
        ("export-op", ["aten::fft_rfft", "not supported"]),
        ("tflite-op", ["tflite", "aten._linalg_det"]),
        ("bad-factory", ["user_models:nothing_here", "no callable"]),
        ("bad-metric", ["--metric 'output=l2'", "unknown kind 'l2'", "abs"]),
        ("metric-of-no-output", ["--metric", "['landmarks']", "its outputs: ['logits']"]),
    ],
)
def test_bad_input_is_one_clear_line_and_leaves_nothing(
    case, needles, edgesdk_cli_module, digits, factory_env, tmp_path
) -> None:
    import onnx
    from onnx import TensorProto, helper

    model, profile, extra = str(digits.onnx), "rpi5-8gb", []
    if case == "unknown-profile":
        profile = "rpi9"
    elif case == "missing-model":
        model = str(tmp_path / "nope.onnx")
    elif case == "garbage-model":
        model = str(tmp_path / "garbage.onnx")
        (tmp_path / "garbage.onnx").write_bytes(b"\x00garbage" * 100)
    elif case == "calibration-shape":
        extra = ["--calibration", _bad_npz(tmp_path / "c.npz", image=np.zeros((4, 3, 8, 8), np.float32))]
    elif case == "calibration-dtype":
        extra = ["--calibration", _bad_npz(tmp_path / "c.npz", image=np.zeros((4, 1, 8, 8), np.float64))]
    elif case == "custom-op":
        graph = helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        )  # fmt: skip
        custom = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
        )
        model = str(tmp_path / "custom.onnx")
        onnx.save_model(custom, model)
    elif case == "export-op":
        model, extra = "user_models:spectrum", ["--input", "x=1x16"]
    elif case == "tflite-op":
        model, extra = "user_models:det", ["--input", "x=1x3x3", "--formats", "tflite"]
    elif case == "bad-factory":
        model = "user_models:nothing_here"
    elif case == "bad-metric":
        extra = ["--metric", "output=l2"]
    elif case == "metric-of-no-output":
        extra = ["--metric", "landmarks=abs:1.5", "--validation", str(digits.validation)]
    out = tmp_path / "out"
    proc = edgesdk_cli_module("convert", model, "--profile", profile, "--out", str(out), *extra, env=factory_env)
    assert_one_line_error(proc, *needles)
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_existing_output_is_never_overwritten(edgesdk_cli_module, digits, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = edgesdk_cli_module("convert", str(digits.onnx), "--profile", "rpi5-8gb", "--out", str(out))
    assert_one_line_error(proc, str(out), "not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_accuracy_aware_repair_keeps_sensitive_layers_in_float(edgesdk_cli_module, digits, tmp_path) -> None:
    # The digits CNN is trained per test session, so how close plain int8 comes to fp32 differs
    # from one training to the next: read it first, then ask for a hair more than it reaches,
    # so that plain int8 misses the gate and the planner must repair, not drop.
    def convert(out, gate: str):
        return edgesdk_cli_module(
            "convert", str(digits.onnx), "--profile", "rpi5-8gb", "--out", str(out), "--formats", "onnx",
            "--precisions", "int8", "--int8-method", "static-qdq-per-channel", "--metric", "cosine", "--gate", gate,
            "--calibration", str(digits.calibration), "--validation", str(digits.validation),
        )  # fmt: skip

    assert convert(tmp_path / "plain", "0.9").returncode == 0
    (plain,) = ConversionReport.model_validate_json((tmp_path / "plain" / "report.json").read_text()).variants
    gate = plain.accuracy.value + 1e-6
    assert gate < 1.0, plain.accuracy
    out = tmp_path / "repair"
    proc = convert(out, repr(gate))
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    (variant,) = report.variants
    assert variant.accuracy.passed and variant.accuracy.value >= gate
    repaired = [d for d in report.decisions if "repaired" in d]
    assert repaired and "most sensitive" in repaired[0], report.decisions
    ranking = next(d for d in report.decisions if d.startswith("int8 sensitivity"))
    kept = repaired[0].split("in float (")[1].split(")")[0].split(", ")
    assert kept and all(name in ranking for name in kept), (kept, ranking)
    assert variant.size > plain.size + 20_000  # the kept layers stay fp32


def _small_profile(folder, max_artifact_mb: float):
    folder.mkdir(exist_ok=True)
    (folder / "tiny-pi.yaml").write_text(
        "schema_version: 1\nname: tiny-pi\ndisplay_name: Raspberry Pi 5 with a tiny model budget\nvendor: test\n"
        f"extends: rpi5-8gb\nstorage:\n  storage_gb: 1\n  max_artifact_mb: {max_artifact_mb}\n"
    )
    return str(folder)


def test_artifact_budget_drops_what_does_not_fit(edgesdk_cli_module, digits, tmp_path) -> None:
    profiles = _small_profile(tmp_path / "profiles", 0.1)  # 102 KiB: only int8 (~65 KiB) fits
    out = tmp_path / "out"
    proc = edgesdk_cli_module(
        "--profiles-dir", profiles, "convert", str(digits.onnx), "--profile", "tiny-pi", "--formats", "onnx",
        "--out", str(out), "--calibration", str(digits.calibration),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert [v.id for v in report.variants] == ["onnx-int8"]
    reasons = {r.precision.value: r.reason for r in report.rejected}
    assert reasons["fp32"].startswith("fp32 dropped: 0.2 MB > artifact budget 0.1 MB")
    assert "fp16 dropped" in reasons["fp16"]


def test_nothing_fits_is_one_line_saying_by_how_much(edgesdk_cli_module, digits, tmp_path) -> None:
    profiles = _small_profile(tmp_path / "profiles", 0.01)
    out = tmp_path / "out"
    proc = edgesdk_cli_module(
        "--profiles-dir", profiles, "convert", str(digits.onnx), "--profile", "tiny-pi", "--formats", "onnx",
        "--out", str(out), "--calibration", str(digits.calibration),
    )  # fmt: skip
    assert_one_line_error(proc, "no variant of digits_cnn can ship to tiny-pi", "artifact budget 0.01 MB", "by 0.")
    assert not out.exists()


def test_converted_variants_survive_packaging_into_a_bundle(rpi5_from_pytorch, tmp_path) -> None:
    # The hand-over: edgesdk package reads this output dir; the device decrypts in memory and
    # loads each variant through load_variant, then checks it against the golden outputs.
    from edgesdk import bundle
    from edgesdk.keys import generate_device_key, generate_publisher_key, load_device_private_key
    from edgesdk.runtimes import load_variant

    out, _ = rpi5_from_pytorch
    publisher, publisher_pub = generate_publisher_key(tmp_path / "publisher")
    device, device_pub = generate_device_key(tmp_path / "device")
    path = bundle.package_bundle(
        out, name="digits", version="1.0.0", release=1, publisher_key=publisher, recipients=[device_pub],
        out=tmp_path / "digits.edgepkg",
    )  # fmt: skip
    from edgesdk.keys import load_publisher_public_key

    verified = bundle.verify_bundle(path, trusted_publishers=[load_publisher_public_key(publisher_pub)])
    key = load_device_private_key(device)
    golden = bundle.decrypt_golden(verified, key)
    for variant in verified.manifest.variants:
        options = {"INFERENCE_PRECISION_HINT": "f32"} if variant.runtime.value == "openvino" else None
        model = load_variant(variant.runtime.value, bundle.decrypt_variant(verified, variant.id, key), options=options)
        spec = model.inputs[0]
        image = golden["image"][:1]
        if spec.quantization is not None:
            q = spec.quantization
            image = np.clip(np.round(image / q.scale[0]) + q.zero_point[0], -128, 127).astype(spec.dtype)
        logits = model.run({spec.name: image})["logits"].astype(np.float32)
        out_q = model.outputs[0].quantization
        if out_q is not None:
            logits = (logits - out_q.zero_point[0]) * out_q.scale[0]
        assert logits.argmax() == golden["output:logits"][0].argmax(), variant.id


@pytest.mark.parametrize(
    ("profile", "formats"),
    [
        ("rpi5-8gb", {"onnx", "openvino"}),
        ("jetson-orin-nano-8gb", {"onnx"}),
        ("intel-nuc-core-ultra", {"openvino", "onnx"}),
        ("apple-m2-mac", {"coreml", "onnx"}),
    ],
)
def test_onnx_file_reaches_every_format_the_device_runs(profile, formats, edgesdk_cli_module, digits, tmp_path) -> None:
    if profile == "apple-m2-mac":
        pytest.importorskip("onnx2coreml")
    if profile in ("rpi5-8gb", "jetson-orin-nano-8gb") and onnx_to_tflite_missing() is None:
        formats = formats | {"tflite"}  # an ONNX→TFLite route (onnx2torch, or onnx2tf's venv) is here
    out = tmp_path / profile
    proc = edgesdk_cli_module(
        "convert", str(digits.onnx), "--profile", profile, "--out", str(out), "--precisions", "fp32",
        "--validation", str(digits.validation),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    assert {v.format.value for v in report.variants} == formats
    # Whatever the device runs that an ONNX file cannot reach here is named, with the reason.
    assert {r.format.value for r in report.rejected} <= {"tflite"}
    for variant in report.variants:
        if variant.format.value == "coreml":  # through onnx2coreml; Linux cannot predict with Core ML
            assert variant.validation == "unvalidated" and variant.inputs[0].shape == [1, 1, 8, 8]
        else:
            assert variant.accuracy.value == 1.0
