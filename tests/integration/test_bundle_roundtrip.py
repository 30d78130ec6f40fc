"""The digits CNN through the bundle path with real runtimes: a convert dir with ONNX fp32 and
an onnxruntime static-QDQ int8 variant → ``edgesdk package`` → ``edgesdk bundle verify`` →
decrypt in memory → onnxruntime predictions equal the plaintext models'."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgesdk.bundle import decrypt_golden, decrypt_variant, verify_bundle
from tests.bundle_helpers import make_digits_convert_dir, make_keys


@pytest.fixture(scope="module")
def packaged(digits, request, tmp_path_factory, edgesdk_cli_module):
    pytest.importorskip("onnxruntime")
    cache = Path(request.config.cache.mkdir("edgesdk-bundle-digits-int8-v1"))
    convert = make_digits_convert_dir(digits, cache / "out")
    keys = make_keys(tmp_path_factory.mktemp("keys"))
    out = tmp_path_factory.mktemp("bundle") / "digits.edgepkg"
    proc = edgesdk_cli_module(
        "package", str(convert), "--name", "digits", "--version", "2.0.0", "--release", "20",
        "--publisher-key", str(keys.publisher_key), "--recipient", str(keys.device_pub),
        "--target", "rpi5-8gb", "--target", "rpi4-4gb", "--expires", "90d", "--out", str(out), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return convert, keys, out


@pytest.fixture(scope="module")
def edgesdk_cli_module():
    import subprocess
    import sys

    def invoke(*args: str):
        return subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True, timeout=300
        )

    return invoke


def test_cli_verify_decrypts_both_variants(packaged, edgesdk_cli_module) -> None:
    _, keys, out = packaged
    proc = edgesdk_cli_module(
        "bundle", "verify", str(out), "--publisher-pub", str(keys.publisher_pub), "--device-key", str(keys.device_key),
        "--profile", "rpi4-4gb", "--installed-release", "19", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["decrypted"]) == {"onnx-fp32", "onnx-int8", "golden"}


def test_decrypted_models_predict_like_the_plaintext_ones(packaged, digits) -> None:
    import onnxruntime as ort

    from edgesdk.runtimes import load_model

    convert, keys, out = packaged
    verified = verify_bundle(out, trusted_publishers=[keys.publisher_pub], profile="rpi5-8gb", installed_release=19)
    images = np.load(digits.validation)["image"]
    for variant in verified.manifest.variants:
        files = decrypt_variant(verified, variant.id, keys.device())
        plain = (convert / "artifacts" / variant.id / "model.onnx").read_bytes()
        assert files == {"model.onnx": plain}
        from_bundle = load_model("onnxruntime", files["model.onnx"]).run({"image": images})["logits"]
        reference = ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(["logits"], {"image": images})[
            0
        ]
        np.testing.assert_array_equal(from_bundle, reference)
        assert variant.accuracy is not None and variant.accuracy.passed
    assert verified.manifest.variant("onnx-int8").quantization_method == "static-qdq-per-channel"
    golden = decrypt_golden(verified, keys.device())
    assert golden is not None and set(golden) == {"image", "output:logits"}
    with np.load(convert / "golden.npz") as expected:
        np.testing.assert_array_equal(golden["output:logits"], expected["output:logits"])
