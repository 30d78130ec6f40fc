"""``/predict`` attacked from outside (issue 42's walk as a hostile local client): images whose
cost lies beyond their size on the wire. A real ``edge-agent run`` serves the digits CNN with
its signed pipeline (the bundle of test_agent_predict.py), with a small ``api.max_decoded_bytes``
so that what each image is charged can be seen in its answer."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from tests.agent_helpers import AgentProcess, agent_env, make_device
from tests.integration.test_agent_predict import (  # noqa: F401 - digits_convert_dir is a fixture
    LABELS,
    _installed,
    _jpegs,
    _package_with_pipeline,
    digits_convert_dir,
)

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
httpx = pytest.importorskip("httpx")

#: A 1000 x 1000 image (the pipeline's max_pixels) may take 4 MB: grey fits, CMYK does not.
MAX_DECODED = 4_000_000


@pytest.fixture(scope="module")
def small_budget_agent(digits_convert_dir, tmp_path_factory):  # noqa: F811 - the imported fixture
    device = make_device(tmp_path_factory.mktemp("predict-outside"))
    device.write_config(api={"host": "127.0.0.1", "port": 0, "max_decoded_bytes": MAX_DECODED})
    _installed(device, _package_with_pipeline(device, digits_convert_dir, version="1.0.0", release=1, labels=LABELS))
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def _post(agent: AgentProcess, body: bytes, content_type: str) -> httpx.Response:
    return httpx.post(
        f"{agent.url}/v1/models/digits/predict", content=body, headers={"Content-Type": content_type}, timeout=60
    )


def _jpeg(mode: str, *, progressive: bool = False) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (1000, 1000)).save(buffer, format="JPEG", progressive=progressive, quality=50)
    return buffer.getvalue()


def _repeating_its_last_scan(jpeg: bytes, times: int) -> bytes:
    """``jpeg`` with its last scan (SOS marker to EOI) repeated: a few kB that the decoder walks
    over every block of the image once per scan."""
    last_scan = jpeg[jpeg.rindex(b"\xff\xda") : -2]
    return jpeg[:-2] + last_scan * times + b"\xff\xd9"


def test_a_jpeg_repeating_its_scans_is_refused_before_the_decoder_runs(small_budget_agent, digits) -> None:
    bomb = _repeating_its_last_scan(_jpeg("L", progressive=True), 1000)
    started = time.monotonic()
    refused = _post(small_budget_agent, bomb, "image/jpeg")
    assert refused.status_code == 413 and "JPEG has 1006 scans" in refused.json()["error"], refused.text
    assert time.monotonic() - started < 30  # the answer names the scans: the refusal came before decoding
    answered = _post(small_budget_agent, _jpegs(digits, 1)[0], "image/jpeg")
    assert answered.status_code == 200 and answered.json()["labels"][0]["label"] in LABELS


def test_an_image_is_charged_the_memory_of_the_mode_it_decodes_to(small_budget_agent) -> None:
    """A CMYK JPEG or an RGBA PNG decodes to 4 bytes a pixel (then a grey copy): charged as grey,
    8 of them at 4000 x 4000 grew an agent by 456 MB within a 128 MB budget. (This pipeline's
    8 x 8 resize has a 1000 x 1000 JPEG decoded at 1/8, edgesdk/pipeline/draft.py: the CMYK one
    then takes 125 x 125 x 5 bytes and is answered; a PNG is decoded whole.)"""
    grey = _post(small_budget_agent, _png("L"), "image/png")
    assert grey.status_code == 200, grey.text
    rgba = _post(small_budget_agent, _png("RGBA"), "image/png")
    assert rgba.status_code == 413 and "api.max_decoded_bytes" in rgba.json()["error"], rgba.text
    assert int(rgba.json()["error"].split("needs ")[1].split()[0]) >= 5_000_000
    assert _post(small_budget_agent, _jpeg("CMYK"), "image/jpeg").status_code == 200


def _png(mode: str) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (1000, 1000)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("image_steps", "named"),
    [
        ("std: [.nan]", "field 'image.std.0': Input should be a finite number"),
        ("scale: .inf", "field 'image.scale': Input should be a finite number"),
        ("center_crop: {height: 100, width: 100}", "center_crop 100x100 is larger than the resize's 8x8"),
    ],
)
def test_a_pipeline_of_absurd_values_is_refused_at_package_time_naming_its_field(
    small_budget_agent,
    digits_convert_dir,  # noqa: F811 - the imported fixture
    image_steps,
    named,
) -> None:
    """Signed, such a pipeline would make every /predict fail (NaN inputs, or a crop no image
    can fill); before, NaN was refused naming the bundle being written and the crop shipped."""
    device = small_budget_agent.device
    pipeline = device.root / "absurd.yaml"
    pipeline.write_text(f"input: image\nimage:\n  color: L\n  resize: {{height: 8, width: 8}}\n  {image_steps}\n")
    bundle = device.root / "absurd.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(digits_convert_dir), "--name", "digits"]
        + ["--version", "9.0.0", "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub)]
        + ["--pipeline", str(pipeline), "--out", str(bundle)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
    )
    assert packaged.returncode == 1 and packaged.stderr.count("\n") == 1, packaged.stderr
    assert f"{pipeline}: " in packaged.stderr and named in packaged.stderr, packaged.stderr
    assert "Traceback" not in packaged.stderr and not bundle.exists()


def test_a_jpeg_sent_as_png_is_a_400_naming_the_content_type_to_send(small_budget_agent, digits) -> None:
    """Before: 'not a valid PNG image: cannot identify image file <_io.BytesIO object at 0x7f...>'."""
    mistyped = _post(small_budget_agent, _jpegs(digits, 1)[0], "image/png")
    assert mistyped.status_code == 400, mistyped.text
    assert "send Content-Type: image/jpeg" in mistyped.json()["error"] and "BytesIO" not in mistyped.text


def test_an_inconclusive_end_to_end_line_says_the_variant_ships(tmp_path) -> None:
    """convert printed '100.00% (95% bound 93.66%) vs gate 99%, 40 files; 268 files would tell' for
    a variant that shipped: read as a bound under its gate, a miss."""
    from edgesdk.converters.end_to_end import Expected, judge

    from tests.unit.test_end_to_end_reference import _answer, _check

    files = [tmp_path / "a.png", tmp_path / "b.png"]
    reading = judge(_check(files, [Expected("cat"), Expected("dog")]), [_answer("cat", 0, 0.9), _answer("dog", 1, 0.8)])
    assert reading.passed and reading.verdict == "inconclusive"
    assert "inconclusive, ships: " in reading.note and "files would tell" in reading.note, reading.note


def test_labels_of_another_length_than_the_classes_are_refused_at_package_time(
    small_budget_agent,
    digits_convert_dir,  # noqa: F811 - the imported fixture
) -> None:
    """Two labels for the ten-class digits CNN packaged, and /predict answered wrong names by
    index; now `package` refuses them in one line naming both counts."""
    device = small_budget_agent.device
    (device.root / "classes.yaml").write_text("input: image\nimage:\n  color: L\n  resize: {height: 8, width: 8}\n")
    (device.root / "two.txt").write_text("cat\ndog\n")
    bundle = device.root / "two-labels.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(digits_convert_dir), "--name", "digits"]
        + ["--version", "9.0.1", "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub)]
        + ["--pipeline", str(device.root / "classes.yaml"), "--labels", str(device.root / "two.txt")]
        + ["--out", str(bundle)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
    )
    assert packaged.returncode == 1 and packaged.stderr.count("\n") == 1, packaged.stderr
    assert "2 labels for output 'logits' of 10 classes" in packaged.stderr, packaged.stderr
    assert "Traceback" not in packaged.stderr and not bundle.exists()
