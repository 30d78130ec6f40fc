"""``folded: [normalize, cast]`` for every runtime that runs here: one real conversion of the
digits CNN to ONNX, LiteRT and OpenVINO folds the pipeline's scale and the uint8 cast into each
graph (Cast/Mul/Add in ONNX, CAST/MUL/ADD in the .tflite, OpenVINO's PrePostProcessor in the IR),
each variant takes the decoder's uint8 and answers what the unfolded path answers (numpy
normalization + the source graph) on the user's real images, and the agent installs the bundle
(its smoke test runs every variant on golden pixels) and answers a JPEG with the user's label."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, make_device, run_agent_cli
from tests.integration.test_convert_end_to_end import PIPELINE, _cli, _write_inputs

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
ort = pytest.importorskip("onnxruntime", reason="the unfolded path runs the source ONNX")
pytest.importorskip("openvino", reason="the OpenVINO variant is folded with its PrePostProcessor")
pytest.importorskip("ai_edge_litert", reason="the LiteRT variant is folded in its flatbuffer")
pytest.importorskip("litert_torch", reason="the LiteRT variant is converted with litert-torch")

FORMATS = ("onnx", "tflite", "openvino")


def _convert_all(digits, root: Path) -> None:
    from tests.agent_helpers import agent_env

    env = {**agent_env(), "DIGITS_ONNX": str(digits.onnx)}
    proc = _cli(
        "convert", str(digits.onnx), "--profile", PROFILE, "--formats", ",".join(FORMATS), "--precisions", "fp32",
        "--out", str(root / "out"), "--calibration", str(digits.calibration), "--validation", str(digits.validation),
        "--pipeline", str(root / "cast.yaml"), "--labels", str(root / "labels.txt"),
        "--validation-images", str(root / "images"), "--reference", f"{root / 'my_preprocess.py'}:predict",
        env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_normalize_and_cast_fold_into_onnx_litert_and_openvino_and_the_agent_serves_them(
    digits, edgesdk_cli, tmp_path: Path, monkeypatch
) -> None:
    from edgesdk.converters.end_to_end import load_reference

    from edgesdk.client import AgentClient
    from edgesdk.pipeline import preprocess
    from edgesdk.runtimes import load_variant
    from edgesdk.schemas.pipeline import load_pipeline
    from edgesdk.schemas.report import ConversionReport

    root = _write_inputs(digits, tmp_path / "user")
    (root / "cast.yaml").write_text(PIPELINE + "folded: [normalize, cast]\n")
    _convert_all(digits, root)
    report = ConversionReport.model_validate_json((root / "out" / "report.json").read_text())
    assert {v.format.value for v in report.variants} == set(FORMATS), report.rejected
    pipeline = load_pipeline(root / "cast.yaml", root / "labels.txt")
    plain = pipeline.model_copy(update={"folded": []})
    source = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    images = sorted((root / "images").glob("*.png"))[:10]
    for variant in report.variants:
        assert variant.task_accuracy is not None and variant.task_accuracy.passed, variant.id
        assert variant.inputs[0].dtype == "uint8", variant.id  # the manifest's declaration
        files = {Path(f).relative_to(f"artifacts/{variant.id}").as_posix(): root / "out" / f for f in variant.files}
        # fp32 compared at fp32 compute: OpenVINO may default to bf16 on this CPU (TOOLCHAIN_NOTES).
        options = {"INFERENCE_PRECISION_HINT": "f32"} if variant.runtime.value == "openvino" else None
        blobs = {name: path.read_bytes() for name, path in files.items()}
        model = load_variant(variant.runtime.value, blobs, options=options)
        try:
            spec = model.inputs[0]
            assert np.dtype(spec.dtype) == np.uint8 and spec.quantization is None, (variant.id, spec)
            for image in images:
                body = image.read_bytes()
                pixels = preprocess(pipeline, body, "image/png", [spec])[spec.name]
                assert pixels.dtype == np.uint8  # straight from the decoder
                normalized = preprocess(plain, body, "image/png", [SimpleNamespace(name="image", dtype="float32")])
                want = source.run(None, normalized)[0]
                got = next(iter(model.run({spec.name: pixels}).values()))
                np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-4, err_msg=variant.id)
        finally:
            model.close()
    device = make_device(tmp_path / "device")
    bundle = tmp_path / "digits.edgepkg"
    packaged = edgesdk_cli(
        "package", str(root / "out"), "--name", "digits", "--version", "1.0.0", "--release", "1",
        "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub), "--target", PROFILE,
        "--out", str(bundle), "--pipeline", str(root / "cast.yaml"), "--labels", str(root / "labels.txt"),
    )  # fmt: skip
    assert packaged.returncode == 0, packaged.stderr
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    # Its smoke test loaded every variant (all three runtimes are here) and each reproduced the
    # golden outputs from the golden pixels, handed as uint8.
    assert installed.returncode == 0, installed.stderr
    monkeypatch.setenv("DIGITS_ONNX", str(digits.onnx))
    predict = load_reference(f"{root / 'my_preprocess.py'}:predict")
    with AgentProcess(device) as agent, AgentClient(agent.url) as client:
        jpeg = tmp_path / "digit-005.jpg"
        Image.open(root / "images" / "digit-005.png").save(jpeg, format="JPEG", quality=90)
        answer = client.predict("digits", jpeg.read_bytes())
        label, score = predict(jpeg)
        assert answer["labels"][0]["label"] == label and abs(answer["labels"][0]["score"] - score) < 1e-3
        assert answer["variant"] in {v.id for v in report.variants}
