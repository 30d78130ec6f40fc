"""``folded: [normalize]`` end to end: convert folds the pipeline's scale into each ONNX variant's
graph, the end-to-end gate judges the folded graphs on the user's own labels, and the packaged
bundle's agent (which skips the folded step) answers a JPEG with the user's label."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent_helpers import PROFILE, AgentProcess, make_device, run_agent_cli
from tests.integration.test_convert_end_to_end import PIPELINE, _convert, _write_inputs

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
onnx = pytest.importorskip("onnx", reason="folding rewrites ONNX graphs")


def test_a_folded_pipeline_is_gated_in_the_graph_and_served_by_the_agent(
    digits, edgesdk_cli, tmp_path: Path, monkeypatch
) -> None:
    from edgesdk.converters.end_to_end import load_reference

    from edgesdk.client import AgentClient
    from edgesdk.schemas.report import ConversionReport

    root = _write_inputs(digits, tmp_path / "user")
    (root / "folded.yaml").write_text(PIPELINE + "folded: [normalize]\n")
    proc = _convert(digits, root, "folded.yaml", "out", "fp32,int8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = ConversionReport.model_validate_json((root / "out" / "report.json").read_text())
    assert {v.id for v in report.variants} == {"onnx-fp32", "onnx-int8"}
    for variant in report.variants:
        assert variant.task_accuracy is not None and variant.task_accuracy.passed, variant.task_accuracy
        graph = onnx.load(str(root / "out" / variant.files[0]), load_external_data=False).graph
        assert [n.name for n in graph.node[:2]] == ["fold_normalize_mul", "fold_normalize_add"], variant.id
    device = make_device(tmp_path / "device")
    bundle = tmp_path / "digits.edgepkg"
    packaged = edgesdk_cli(
        "package", str(root / "out"), "--name", "digits", "--version", "1.0.0", "--release", "1",
        "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub), "--target", PROFILE,
        "--out", str(bundle), "--pipeline", str(root / "folded.yaml"), "--labels", str(root / "labels.txt"),
    )  # fmt: skip
    assert packaged.returncode == 0, packaged.stderr
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr  # its smoke test feeds golden pixels to the folded graph
    monkeypatch.setenv("DIGITS_ONNX", str(digits.onnx))
    predict = load_reference(f"{root / 'my_preprocess.py'}:predict")
    with AgentProcess(device) as agent, AgentClient(agent.url) as client:
        for name in ("digit-003.png", "digit-017.png"):
            jpeg = tmp_path / name.replace(".png", ".jpg")
            Image.open(root / "images" / name).save(jpeg, format="JPEG", quality=90)
            answer = client.predict("digits", jpeg.read_bytes())
            label, score = predict(jpeg)
            assert answer["labels"][0]["label"] == label and abs(answer["labels"][0]["score"] - score) < 1e-3
