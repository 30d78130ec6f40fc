"""Property-based fuzz of what parses a pipeline's input (issue 42), through the real parsers:
WAV/raw PCM headers built field by field (sizes, chunk lengths, format tags, channels, bits,
WAVE_FORMAT_EXTENSIBLE sub-formats, chunk order, truncation), PNG/JPEG headers with declared
dimensions rewritten, text bodies (invalid UTF-8, lone surrogates, deep JSON, huge, plain text)
through a real tokenizer.json, mutated pipeline YAML with labels, vocabulary and tokenizer files,
and ``--task-gate`` values through the real CLI. The only error a body may raise is a
``PipelineInputError`` with a 4xx status; a pipeline file, one SchemaError/UsageError line; the
CLI, one line and a non-zero exit. A bomb is refused by its declared size, which tracemalloc checks.

test_pipeline_wav_fuzz.py and test_pipeline_decode_fuzz.py flip random bytes; this file aims at
the header fields a parser trusts. Bounded: derandomized, 60-150 examples a property, no deadline
(the machine is shared); the file runs in about 10 s."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the dev extra installs it)")
pytest.importorskip("scipy.signal", reason="resampling needs scipy (pip install 'edgesdk[pipeline]')")
Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
tokenizers = pytest.importorskip(
    "tokenizers", reason="the text pipeline needs tokenizers (pip install 'edgesdk[pipeline]')"
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.errors import SchemaError, UsageError  # noqa: E402
from edgesdk.pipeline import PipelineInputError, prepare, preprocess  # noqa: E402
from edgesdk.schemas.manifest import TensorSpec  # noqa: E402
from edgesdk.schemas.pipeline import Pipeline, load_pipeline  # noqa: E402


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
    )


def refused_4xx(error: PipelineInputError) -> None:
    assert 400 <= error.status < 500 and str(error) and "\n" not in str(error), (error.status, str(error))


# --- (a) WAV and raw PCM ------------------------------------------------------------------------

AUDIO_MAX_BYTES = 64_000
AUDIO_PIPELINES = {
    "log_mel": Pipeline.model_validate(
        {
            "input": "audio",
            "audio": {
                "length": 1600,
                "log_mel": {"n_fft": 256, "hop": 128, "n_mels": 8},
                "max_bytes": AUDIO_MAX_BYTES,
                "pcm": {"rate": 8000, "channels": 2},
            },
        }
    ),
    "stream": Pipeline.model_validate(
        {
            "input": "audio",
            "audio": {"micro_frontend": {}, "stream": {"frames": 3, "max_calls": 40}, "max_bytes": AUDIO_MAX_BYTES},
            "post": {"kind": "detection", "threshold": 0.5},
        }
    ),
    "waveform": Pipeline.model_validate({"input": "audio", "audio": {"max_bytes": AUDIO_MAX_BYTES}}),
}
AUDIO_INPUTS = {
    "log_mel": [TensorSpec(name="mel", dtype="float32", shape=[1, 11, 8])],
    "stream": [TensorSpec(name="features", dtype="float32", shape=[1, 3, 40])],
    "waveform": [TensorSpec(name="samples", dtype="float32", shape=[1, "samples"])],
}
FORMAT_TAGS = [1, 3, 0xFFFE, 0, 2, 6, 0x55, 0xFFFF]


def _chunk(kind: bytes, declared: int, payload: bytes) -> bytes:
    return kind + struct.pack("<I", declared) + payload


WAV_FIELDS = ["tag", "channels", "bits", "rate", "block_align", "sub", "fmt_cut", "fmt_size", "data_size"]
WAV_FIELDS += ["list_chunk", "order", "riff", "truncate"]


@st.composite
def wav_files(draw: st.DrawFn) -> bytes:
    """A WAV assembled from header fields: a valid file with up to three of them drawn wrong."""
    wrong = draw(st.sets(st.sampled_from(WAV_FIELDS), max_size=3))

    def field(name: str, good: st.SearchStrategy, bad: st.SearchStrategy) -> object:
        return draw(bad if name in wrong else good)

    extensible = draw(st.booleans())
    tag = field("tag", st.just(0xFFFE if extensible else 1), st.sampled_from(FORMAT_TAGS))
    sub = field("sub", st.sampled_from([1, 3]), st.sampled_from(FORMAT_TAGS))
    bits = field(
        "bits",
        st.just(32 if sub == 3 and extensible else draw(st.sampled_from([16, 32]))),
        st.sampled_from([0, 8, 24, 64, 0xFFFF]),
    )
    channels = field("channels", st.sampled_from([1, 2, 3]), st.sampled_from([0, 16, 17, 0xFFFF]))
    rate = field(
        "rate", st.sampled_from([16000, 8000, 44100, 48000]), st.sampled_from([999, 1000, 44101, 384_001, 0, 2**32 - 1])
    )
    block_align = field("block_align", st.just(channels * bits // 8 & 0xFFFF), st.integers(0, 0xFFFF))
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block_align & 0xFFFFFFFF, block_align, bits)
    if extensible or tag == 0xFFFE:  # cbSize, valid bits, channel mask, then the sub-format GUID
        fmt += struct.pack("<HHI", 22, bits, 3) + struct.pack("<H", sub) + bytes(14)
    fmt = fmt[: field("fmt_cut", st.just(len(fmt)), st.sampled_from([16, 18, 25, 14, 0]))]
    fmt_size = field("fmt_size", st.just(len(fmt)), st.one_of(st.integers(0, 64), st.just(2**32 - 1)))
    frames = draw(st.integers(0, 3000 // max(channels, 1)))
    width = max(bits // 8, 1) * max(channels, 1) if bits <= 64 else 2
    payload = np.random.default_rng(frames).uniform(-1, 1, frames * width // 4 + 1).astype("<f4").tobytes()
    payload = payload[: frames * width]
    if (sub if tag == 0xFFFE else tag) == 1:  # integer samples: any bytes are valid
        payload = np.random.default_rng(frames).integers(0, 256, frames * width, dtype=np.uint8).tobytes()
    data_size = field(
        "data_size",
        st.just(len(payload)),
        st.one_of(st.integers(0, len(payload) + 64), st.sampled_from([AUDIO_MAX_BYTES + 1, 2**31, 2**32 - 1])),
    )
    chunks = [_chunk(b"fmt ", fmt_size, fmt), _chunk(b"data", data_size, payload)]
    if "list_chunk" in wrong:  # an unknown chunk of odd (padded) or impossible size before the data
        chunks.insert(1, _chunk(b"LIST", draw(st.sampled_from([3, 4, 5, 2**32 - 1])), b"abcd"))
    if "order" in wrong:
        chunks.reverse()
    body = b"".join(chunks)
    wav = field("riff", st.just(b"RIFF"), st.sampled_from([b"RIFX", b"RIF", b"WAVE"])) + struct.pack(
        "<I", len(body) + 4
    )
    wav += b"WAVE" + body
    return wav[: field("truncate", st.just(len(wav)), st.integers(0, len(wav)))]


def _expected_shape(name: str, feeds: dict[str, np.ndarray]) -> None:
    (tensor,) = feeds.values()
    assert tensor.dtype == np.float32 and np.isfinite(tensor).all()
    if name == "log_mel":
        assert tensor.shape == (1, 11, 8)
    elif name == "stream":
        assert tensor.ndim == 4 and tensor.shape[1:] == (1, 3, 40) and 1 <= tensor.shape[0] <= 40
    else:
        assert tensor.ndim == 2 and tensor.shape[0] == 1 and tensor.shape[1] >= 1


@fuzz(150)
@given(wav_files(), st.sampled_from(sorted(AUDIO_PIPELINES)))
def test_wav_header_fields_give_samples_or_a_4xx(wav: bytes, name: str) -> None:
    try:
        feeds = preprocess(AUDIO_PIPELINES[name], wav, "audio/wav", AUDIO_INPUTS[name])
    except PipelineInputError as refused:
        refused_4xx(refused)
        return
    _expected_shape(name, feeds)


@fuzz(60)
@given(st.binary(max_size=AUDIO_MAX_BYTES + 8), st.sampled_from(["audio/pcm", "audio/x-pcm", "audio/L16", ""]))
def test_raw_pcm_bodies_give_samples_or_a_4xx(body: bytes, media: str) -> None:
    try:
        feeds = preprocess(AUDIO_PIPELINES["log_mel"], body, media, AUDIO_INPUTS["log_mel"])
    except PipelineInputError as refused:
        refused_4xx(refused)
        return
    assert media == "audio/pcm" and len(body) % 4 == 0 and len(body) > 0
    _expected_shape("log_mel", feeds)


def _peak_bytes(run) -> int:
    tracemalloc.start()
    try:
        run()
    except PipelineInputError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _wav(declared: int, payload: bytes, channels: int = 1, bits: int = 16) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, channels, 16000, 16000 * channels * bits // 8, channels * bits // 8, bits)
    body = _chunk(b"fmt ", 16, fmt) + _chunk(b"data", declared, payload)
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WAVE" + body


@pytest.mark.parametrize(
    "declared, carried",
    [(2**32 - 1, 1000), (AUDIO_MAX_BYTES + 2, AUDIO_MAX_BYTES + 2), (AUDIO_MAX_BYTES, AUDIO_MAX_BYTES)],
)
def test_a_wavs_declared_size_bounds_what_decoding_it_allocates(declared: int, carried: int) -> None:
    """Over the pipeline's max_bytes: refused having allocated next to nothing; at the bound:
    decoded within a few times the bound (float32 copies, resampling), never the declared size."""
    wav = _wav(declared, bytes(carried))
    pipeline = AUDIO_PIPELINES["waveform"]
    peak = _peak_bytes(lambda: preprocess(pipeline, wav, "audio/wav", AUDIO_INPUTS["waveform"]))
    bound = 64 * 1024 if declared > AUDIO_MAX_BYTES else 8 * AUDIO_MAX_BYTES
    assert peak < bound, (declared, peak)


# --- (b) PNG and JPEG ---------------------------------------------------------------------------

IMAGE_PIPELINES = {
    "resize": Pipeline.model_validate({"image": {"resize": {"height": 8, "width": 8}, "max_pixels": 4096}}),
    "letterbox_crop": Pipeline.model_validate(
        {
            "image": {
                "color": "L",
                "resize": {"height": 16, "width": 16, "letterbox": {}},
                "center_crop": {"height": 12, "width": 12},
                "max_pixels": 4096,
            }
        }
    ),
    "crop_only": Pipeline.model_validate(
        {"image": {"color": "BGR", "center_crop": {"height": 4, "width": 4}, "layout": "NHWC", "max_pixels": 4096}}
    ),
}
IMAGE_SHAPES = {"resize": (1, 3, 8, 8), "letterbox_crop": (1, 1, 12, 12), "crop_only": (1, 4, 4, 3)}
IMAGE_INPUTS = {
    "resize": [TensorSpec(name="x", dtype="float32", shape=[1, 3, 8, 8])],
    "letterbox_crop": [TensorSpec(name="x", dtype="float32", shape=[1, 1, 12, 12])],
    "crop_only": [TensorSpec(name="x", dtype="uint8", shape=[1, 4, 4, 3])],
}


def _png_chunk(kind: bytes, payload: bytes, crc_ok: bool = True) -> bytes:
    crc = zlib.crc32(kind + payload) if crc_ok else 0
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


PNG_FIELDS = ["width", "height", "depth", "color", "interlace", "crc", "idat", "truncate"]


@st.composite
def png_files(draw: st.DrawFn) -> bytes:
    """A small real PNG with up to three IHDR fields (declared size, depth, colour type), its CRC,
    its pixel data or its length drawn wrong."""
    wrong = draw(st.sets(st.sampled_from(PNG_FIELDS), max_size=3))
    real_w, real_h = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    rows = b"".join(b"\x00" + bytes(range(real_w * 3)) for _ in range(real_h))
    odd_sides = st.sampled_from([0, 1, 64, 65, 5000, 50_000, 2**31 - 1, 2**32 - 1])
    width = draw(odd_sides) if "width" in wrong else real_w
    height = draw(odd_sides) if "height" in wrong else real_h
    depth = draw(st.sampled_from([1, 16, 3, 0])) if "depth" in wrong else 8
    color = draw(st.sampled_from([0, 3, 4, 6, 7])) if "color" in wrong else 2
    interlace = draw(st.sampled_from([1, 2])) if "interlace" in wrong else 0
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, interlace)
    idat = zlib.compress(rows)
    if "idat" in wrong:
        idat = draw(st.sampled_from([idat[: len(idat) // 2], idat[:-4] + bytes(4), b"", zlib.compress(rows[:-1])]))
    png = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr, crc_ok="crc" not in wrong)
        + (_png_chunk(b"PLTE", bytes(range(9))) if color == 3 else b"")
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )
    return png[: draw(st.integers(0, len(png))) if "truncate" in wrong else len(png)]


def _real_jpeg() -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(7).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


JPEG = _real_jpeg()
SOF = JPEG.index(b"\xff\xc0")  # baseline start of frame: length, precision, height, width, components


@st.composite
def jpeg_files(draw: st.DrawFn) -> bytes:
    """The real JPEG with up to two of its frame header's precision, dimensions and component
    count drawn, sometimes cut short."""
    data = bytearray(JPEG)
    fields = [(SOF + 4, ">B", [12, 0, 255]), (SOF + 5, ">H", [0, 1, 64, 5000, 0xFFFF])]
    fields += [(SOF + 7, ">H", [0, 1, 65, 5000, 0xFFFF]), (SOF + 9, ">B", [0, 1, 2, 4, 255])]
    for at, fmt, values in draw(st.lists(st.sampled_from(fields), max_size=2)):
        struct.pack_into(fmt, data, at, draw(st.sampled_from(values)))
    return bytes(data[: draw(st.one_of(st.just(len(data)), st.integers(0, len(data))))])


@fuzz(150)
@given(
    st.one_of(
        st.tuples(png_files(), st.just("image/png")),
        st.tuples(jpeg_files(), st.just("image/jpeg")),
        st.tuples(st.one_of(png_files(), jpeg_files()), st.sampled_from(["image/png", "image/jpeg", "image/gif"])),
    ),
    st.sampled_from(sorted(IMAGE_PIPELINES)),
)
def test_image_header_fields_give_an_image_or_a_4xx(case: tuple[bytes, str], name: str) -> None:
    data, media = case
    try:
        feeds = preprocess(IMAGE_PIPELINES[name], data, media, IMAGE_INPUTS[name])
    except PipelineInputError as refused:
        refused_4xx(refused)
        return
    (tensor,) = feeds.values()
    assert tensor.shape == IMAGE_SHAPES[name] and tensor.dtype == IMAGE_INPUTS[name][0].dtype


@pytest.mark.parametrize("media", ["image/png", "image/jpeg"])
def test_a_declared_image_bomb_is_refused_before_decoding(media: str) -> None:
    """5000 x 5000 declared (under Pillow's own bomb limit, over the pipeline's) in a few hundred bytes: 413, having allocated next to nothing."""
    if media == "image/png":
        ihdr = struct.pack(">IIBBBBB", 5000, 5000, 8, 2, 0, 0, 0)
        data = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(bytes(64)))
    else:
        data = bytearray(JPEG)
        struct.pack_into(">HH", data, SOF + 5, 5000, 5000)
        data = bytes(data)
    pipeline = IMAGE_PIPELINES["resize"]
    with pytest.raises(PipelineInputError) as refused:
        prepare(pipeline, data, media, IMAGE_INPUTS["resize"])
    assert refused.value.status == 413 and "5000x5000" in str(refused.value)
    assert _peak_bytes(lambda: prepare(pipeline, data, media, IMAGE_INPUTS["resize"])) < 256 * 1024


# --- (c) text -----------------------------------------------------------------------------------


def _tokenizer_json() -> str:
    """The suite's MiniLM tokenizer.json where its files are here, else a tiny WordPiece one."""
    from edgesdk.errors import ModelError
    from edgesdk.workloads.text_encoder import model_dir

    try:
        return (model_dir() / "tokenizer.json").read_text(encoding="utf-8")
    except (ModelError, OSError):
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

        vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "the", "agent", "##s", "a", "é", "日"])}
        tiny = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tiny.normalizer = normalizers.BertNormalizer()
        tiny.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tiny.to_str()


TOKENIZER = _tokenizer_json()
TEXT_PIPELINES = [
    Pipeline.model_validate(
        {"input": "text", "text": {"tokenizer": TOKENIZER, "max_chars": 2000}, "post": {"kind": "embedding"}}
    ),
    Pipeline.model_validate(
        {
            "input": "text",
            "text": {"tokenizer": TOKENIZER, "max_length": 16, "pad_to_max_length": True, "max_chars": 2000},
            "post": {"kind": "embedding"},
        }
    ),
]
TEXT_INPUTS = [
    TensorSpec(name=n, dtype="int64", shape=[1, "s"]) for n in ("input_ids", "attention_mask", "token_type_ids")
]


def _as_json(text: str, how: str) -> bytes:
    if how == "ascii":
        return json.dumps({"text": text}).encode()
    document = json.dumps({"text": text}, ensure_ascii=False)
    return document.encode("utf-16") if how == "utf-16" else document.encode("utf-8", "surrogatepass")


ESCAPES = [b"\\ud800", b"\\udfff x", b"\\ud83d", b"\x80\xff", b"\\u0000", b"\\ud83d\\ude00"]
TEXT_BODIES = st.one_of(
    st.builds(_as_json, st.text(max_size=300), st.sampled_from(["ascii", "utf-8", "utf-16"])),
    st.text(max_size=300).map(str.encode),  # plain text, not JSON
    st.sampled_from(ESCAPES).map(lambda escape: b'{"text": "a %s"}' % escape),  # lone surrogates, bad UTF-8
    st.integers(1, 12_000).map(lambda depth: b"[" * depth),  # deep JSON
    st.integers(1, 4_000).map(lambda depth: b'{"text": ' * depth),
    st.integers(400, 600).map(lambda words: json.dumps({"text": "the " * words}).encode()),  # about max_chars
    st.builds(lambda text: json.dumps({"text": text, "extra": 1}).encode(), st.text(max_size=20)),
    st.builds(lambda text: json.dumps([text]).encode(), st.text(max_size=20)),
    st.binary(max_size=300),
)


@fuzz(150)
@given(TEXT_BODIES, st.sampled_from([0, 1]), st.sampled_from(["application/json", "application/json", "text/plain"]))
def test_text_bodies_give_token_ids_or_a_4xx(body: bytes, which: int, media: str) -> None:
    try:
        feeds = preprocess(TEXT_PIPELINES[which], body, media, TEXT_INPUTS)
    except PipelineInputError as refused:
        refused_4xx(refused)
        return
    shapes = {tensor.shape for tensor in feeds.values()}
    assert len(shapes) == 1 and all(tensor.dtype == np.int64 for tensor in feeds.values())
    (shape,) = shapes
    assert shape[0] == 1 and (shape[1] == 16 if which else 1 <= shape[1] <= 128)


@pytest.mark.parametrize("body", [b'{"text": "\\ud800"}', b"[" * 100_000], ids=["lone_surrogate", "deep_json"])
def test_text_that_once_raised_an_uncaught_error_is_a_400(body: bytes) -> None:
    """Found by the fuzz above: a lone surrogate reached the tokenizer (TypeError), deep JSON
    nesting overflowed the parser's recursion (RecursionError); both were answered 500."""
    pipeline = Pipeline.model_validate(
        {"input": "text", "text": {"tokenizer": TOKENIZER}, "post": {"kind": "embedding"}}
    )
    with pytest.raises(PipelineInputError) as refused:
        preprocess(pipeline, body, "application/json", TEXT_INPUTS)
    assert refused.value.status == 400


# --- (d) pipeline files -------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED_DOCUMENTS = sorted(
    path.read_text(encoding="utf-8")
    for path in EXAMPLES.rglob("*.yaml")
    if "post:" in path.read_text(encoding="utf-8") or "input:" in path.read_text(encoding="utf-8")
) or ["input: image\nimage: {resize: {height: 8, width: 8}, scale: 0.0039}\npost: {activation: softmax, top_k: 3}\n"]
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(-3, 300), max_size=4),
    st.dictionaries(st.sampled_from(["height", "width", "kind", "n_fft", "x"]), st.integers(-1, 99), max_size=3),
)
FILE_TEXTS = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.just("a" * 300 + "\n"),
    st.just("\n\n"),
    st.just('{"model": {"type": "Nope"}}'),
)


def _mutate_tree(node: object, draw: st.DrawFn) -> object:
    """One key's value replaced, removed or an unknown key added, somewhere in the mapping tree."""
    if not isinstance(node, dict) or not node:
        return draw(ODD_VALUES)
    key = draw(st.sampled_from(sorted(node, key=str)))
    action = draw(st.sampled_from(["descend", "descend", "replace", "remove", "add"]))
    if action == "descend":
        return node | {key: _mutate_tree(node[key], draw)}
    if action == "replace":
        return node | {key: draw(ODD_VALUES)}
    if action == "remove":
        return {k: v for k, v in node.items() if k != key}
    return node | {draw(st.sampled_from(["extra", "labels", "tokenizer", "folded", "stream"])): draw(ODD_VALUES)}


@st.composite
def pipeline_documents(draw: st.DrawFn) -> str:
    import yaml

    document = draw(st.sampled_from(SEED_DOCUMENTS))
    how = draw(st.sampled_from(["tree", "tree", "tree", "text"]))
    if how == "tree":
        for _ in range(draw(st.integers(1, 3))):
            document = yaml.safe_dump(_mutate_tree(yaml.safe_load(document), draw))
        return document
    chars = list(document)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(chars) - 1, 0)))
        chars[at:at] = draw(
            st.sampled_from([":", "{", "[", "&a", "*a", "!!python/object:os.system", "\t", "\x00", "-"])
        )
    return "".join(chars)


@pytest.fixture(scope="module")
def pipeline_dir():
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@fuzz(120)
@given(pipeline_documents(), st.tuples(*[st.one_of(st.none(), FILE_TEXTS)] * 3))
def test_mutated_pipeline_files_load_or_name_one_problem(pipeline_dir: Path, document: str, files: tuple) -> None:
    (pipeline_dir / "p.yaml").write_bytes(document.encode("utf-8", "surrogatepass"))
    paths = []
    for name, text in zip(("labels.txt", "tokenizer.json", "vocabulary.txt"), files, strict=True):
        if text is not None:
            (pipeline_dir / name).write_bytes(text.encode("utf-8", "surrogatepass"))
        paths.append(pipeline_dir / name if text is not None else None)
    try:
        pipeline = load_pipeline(pipeline_dir / "p.yaml", *paths)
    except (SchemaError, UsageError) as refused:
        message = str(refused)
        assert message and "\n" not in message and "Traceback" not in message, message
        return
    assert isinstance(pipeline, Pipeline)


# --- (e) --task-gate through the CLI -----------------------------------------------------------

BAD_GATES = ["cer=abc", "cer=0.1@p100", "nope=0.5", "cer=nan", "cer=inf", "0.5"]


def test_bad_task_gates_are_one_line_and_a_nonzero_exit_through_the_cli(tmp_path: Path) -> None:
    """Each bad ``--task-gate`` value, run in parallel real ``edgesdk convert`` processes: one
    ``error:`` line naming the value, exit 1, no traceback, nothing converted."""
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "a.png").write_bytes(b"not read: the gate is checked first")
    (tmp_path / "pipeline.yaml").write_text("post: {kind: ctc, vocabulary: [blank, a, b]}\n")
    (tmp_path / "ref.json").write_text("{}")
    argv = [sys.executable, "-m", "edgesdk.cli.main", "convert", "m.onnx", "--profile", "rpi5-8gb", "--out", "out"]
    argv += ["--pipeline", "pipeline.yaml", "--validation-images", "lines", "--reference", "ref.json"]
    runs = {
        gate: subprocess.Popen(
            [*argv, "--task-gate", gate], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for gate in BAD_GATES
    }
    for gate, run in runs.items():
        _, err = run.communicate(timeout=120)
        assert run.returncode == 1 and "Traceback" not in err, (gate, err)
        assert err.strip().startswith(f"error: --task-gate {gate}: ") and err.strip().count("\n") == 0, (gate, err)
    assert not (tmp_path / "out").exists()
