"""The bundle pipeline's schema and the device's image and post steps, each against a
reference written the usual way (Pillow + numpy, as a user's own preprocessing would be)."""

from __future__ import annotations

import io
import struct
import sys
import zlib

import numpy as np
import pytest

from edgesdk.errors import SchemaError
from edgesdk.schemas.manifest import BundleManifest
from edgesdk.schemas.pipeline import Pipeline, PostProcess

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")

from edgesdk.pipeline.image import PipelineInputError, open_image, to_tensor  # noqa: E402
from edgesdk.pipeline.post import mask_png, top_classes  # noqa: E402


def _encoded(pixels: np.ndarray, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _photo(height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_pipeline_schema_refuses_unknown_inputs_and_bad_steps_in_one_line() -> None:
    with pytest.raises(SchemaError, match=r"field 'input'.*'image', 'audio' or 'text' \(got 'video'\)"):
        Pipeline.parse_obj_clear({"input": "video"}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"field 'post.kind'.*'embedding' or 'detection' \(got 'nms'\)"):
        Pipeline.parse_obj_clear({"post": {"kind": "nms"}}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"a text pipeline needs its tokenizer \(packaged with --tokenizer"):
        Pipeline.parse_obj_clear({"input": "text"}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"framing and log_mel .*: name one"):
        Pipeline.parse_obj_clear({"audio": {"framing": {"length": 4, "hop": 4}, "log_mel": {}}}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"field 'image.std'.*non-zero"):
        Pipeline.parse_obj_clear({"image": {"std": [1, 0, 1]}}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"mean has 2 values; color RGB needs 1 or 3"):
        Pipeline.parse_obj_clear({"image": {"mean": [1, 2]}}, source="p.yaml")
    with pytest.raises(SchemaError, match=r"field 'image.resize.interpolation'"):
        Pipeline.parse_obj_clear({"image": {"resize": {"height": 8, "width": 8, "interpolation": "cubic"}}}, source="p")
    with pytest.raises(SchemaError, match=r"field 'image.colour'.*Extra inputs"):
        Pipeline.parse_obj_clear({"image": {"colour": "RGB"}}, source="p.yaml")


def test_packaged_pipeline_and_labels_are_covered_by_the_bundle_signature(tmp_path) -> None:
    from edgesdk.bundle import verify_bundle
    from edgesdk.errors import SignatureError
    from edgesdk.keys import load_publisher_public_key
    from edgesdk.toolchain import package
    from tests.bundle_helpers import make_keys, write_convert_dir

    keys = make_keys(tmp_path / "keys")
    convert = write_convert_dir(tmp_path / "convert", {"onnx-fp32": {"model.onnx": b"not a model"}})
    (tmp_path / "pipeline.yaml").write_text("image: {color: L}\npost: {activation: softmax, top_k: 2}\n")
    # One label a class (the convert dir's output has 10); a blank last line is no label.
    (tmp_path / "labels.txt").write_text("cat\ndog\n" + "".join(f"class-{i}\n" for i in range(2, 10)) + "\n")
    bundle = package(
        convert,
        out=tmp_path / "b.edgepkg",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=keys.device_pub,
        pipeline=tmp_path / "pipeline.yaml",
        labels=tmp_path / "labels.txt",
    )
    trusted = [load_publisher_public_key(keys.publisher_pub)]
    manifest = verify_bundle(bundle, trusted_publishers=trusted).manifest
    assert isinstance(manifest, BundleManifest) and manifest.pipeline is not None
    labels = manifest.pipeline.post.labels
    assert labels is not None and labels[:3] == ["cat", "dog", "class-2"] and len(labels) == 10
    assert manifest.pipeline.image.color == "L"

    data = bundle.read_bytes()
    swapped = tmp_path / "swapped.edgepkg"
    swapped.write_bytes(data.replace(b'"cat","dog"', b'"dog","cat"', 1))
    assert swapped.read_bytes() != data
    with pytest.raises(SignatureError):
        verify_bundle(swapped, trusted_publishers=trusted)


def test_package_command_refuses_a_bad_pipeline_file_in_one_line(tmp_path) -> None:
    import subprocess
    import sys

    (tmp_path / "pipeline.yaml").write_text("input: video\n")
    base = [sys.executable, "-m", "edgesdk.cli.main", "package", str(tmp_path), "--name", "m", "--version", "1.0.0"]
    base += ["--publisher-key", "p.key", "--recipient", "d.pub", "--out", str(tmp_path / "o.edgepkg")]
    bad_field = subprocess.run(
        [*base, "--pipeline", str(tmp_path / "pipeline.yaml")], capture_output=True, text=True, timeout=60
    )
    assert bad_field.returncode == 1
    assert bad_field.stderr.strip().count("\n") == 0 and "Traceback" not in bad_field.stderr
    assert "field 'input'" in bad_field.stderr and "(got 'video')" in bad_field.stderr
    missing = subprocess.run(
        [*base, "--pipeline", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and "nope.yaml: cannot read it" in missing.stderr


def test_image_steps_match_pillow_and_numpy_reference() -> None:
    pipeline = Pipeline.model_validate(
        {
            "image": {
                "color": "BGR",
                "resize": {"height": 40, "width": 36, "interpolation": "bicubic"},
                "center_crop": {"height": 32, "width": 30},
                "scale": 1 / 255,
                "mean": [0.485, 0.456, 0.406],
                "std": [0.229, 0.224, 0.225],
                "layout": "NCHW",
            }
        }
    )
    data = _encoded(_photo(), "PNG")
    tensor = to_tensor(open_image(data, "image/png", 10_000), pipeline.image, np.dtype("float32"))

    # The reference: what a user's own preprocessing looks like.
    image = Image.open(io.BytesIO(data)).convert("RGB").resize((36, 40), Image.Resampling.BICUBIC)
    left, top = (36 - 30) // 2, (40 - 32) // 2
    x = np.asarray(image.crop((left, top, left + 30, top + 32)), dtype=np.float32) / 255.0
    x = (x[:, :, ::-1] - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    expected = x.transpose(2, 0, 1)[None].astype(np.float32)

    assert tensor.shape == (1, 3, 32, 30) and tensor.dtype == np.float32
    np.testing.assert_allclose(tensor, expected, rtol=1e-5, atol=1e-5)


def test_grey_nhwc_uint8_input_is_rounded_and_clipped_into_the_models_dtype() -> None:
    pipeline = Pipeline.model_validate(
        {"image": {"color": "L", "resize": {"height": 8, "width": 8, "interpolation": "nearest"}, "layout": "NHWC"}}
    )
    data = _encoded(_photo(16, 16), "JPEG", quality=95)
    tensor = to_tensor(open_image(data, "image/jpeg", 10_000), pipeline.image, np.dtype("uint8"))
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("L").resize((8, 8), Image.Resampling.NEAREST))
    assert tensor.dtype == np.uint8 and tensor.shape == (1, 8, 8, 1)
    np.testing.assert_array_equal(tensor[0, :, :, 0], expected)


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` × ``height`` (its data is one tiny zlib stream)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("side", [5_000, 60_000], ids=["over-the-pipeline-limit", "over-pillows-own-limit"])
def test_decompression_bomb_is_refused_by_its_declared_size_before_decoding(side: int) -> None:
    with pytest.raises(PipelineInputError, match=r"pixels|before decoding") as refused:
        open_image(_png_declaring(side, side), "image/png", max_pixels=1_000_000)
    assert refused.value.status == 413


def test_corrupt_and_mistyped_images_are_4xx_with_the_reason() -> None:
    jpeg = _encoded(_photo(), "JPEG")
    pre = Pipeline().image
    with pytest.raises(PipelineInputError, match="not a valid JPEG") as garbage:
        open_image(b"\xff\xd8\xff" + b"\x00" * 100, "image/jpeg", 10_000)
    assert garbage.value.status == 400
    with pytest.raises(PipelineInputError, match="cannot decode the image") as truncated:
        to_tensor(open_image(jpeg[: len(jpeg) // 2], "image/jpeg", 10_000), pre, np.dtype("float32"))
    assert truncated.value.status == 400
    with pytest.raises(PipelineInputError, match="not a valid PNG"):
        open_image(jpeg, "image/png", 10_000)  # a JPEG sent as PNG: only the named decoder runs
    with pytest.raises(PipelineInputError, match="image/jpeg or image/png") as gif:
        open_image(b"GIF89a", "image/gif", 10_000)
    assert gif.value.status == 415


def test_top_k_softmax_with_labels_and_threshold_match_numpy() -> None:
    logits = np.array([[0.5, 3.0, -1.0, 2.0]], dtype=np.float32)
    post = PostProcess(activation="softmax", top_k=3, threshold=0.1, labels=["cat", "dog", "fox", "owl"])
    probabilities = np.exp(logits[0]) / np.exp(logits[0]).sum()
    result = top_classes(logits, post)
    assert [r["label"] for r in result] == ["dog", "owl"]  # cat (0.06) and fox (0.01) fall under 0.1
    assert result[0]["score"] == pytest.approx(probabilities[1])
    sigmoid = top_classes(logits, PostProcess(activation="sigmoid", top_k=1))
    assert sigmoid == [{"label": "1", "index": 1, "score": pytest.approx(1 / (1 + np.exp(-3.0)))}]


def test_argmax_mask_is_a_png_of_class_indices() -> None:
    scores = np.random.default_rng(1).normal(size=(1, 4, 6, 5)).astype(np.float32)
    png = mask_png(scores, PostProcess(kind="mask"))
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), scores[0].argmax(axis=0))


def test_an_agent_without_pillow_answers_501_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # as on an agent installed without the extra
    with pytest.raises(PipelineInputError, match=r"pip install 'edgesdk\[pipeline\]'") as missing:
        open_image(b"\xff\xd8\xff", "image/jpeg", 100)
    assert missing.value.status == 501
