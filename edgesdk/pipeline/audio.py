"""WAV or raw PCM bytes → the model's audio input, as the bundle's pipeline declares.

The WAV header is parsed by hand (RIFF chunks; the stdlib ``wave`` module reads neither float
samples nor, before Python 3.12, WAVE_FORMAT_EXTENSIBLE), and the data chunk's declared size —
frames × channels × sample width — is checked against the pipeline's ``max_bytes`` and the
request's memory allowance before a sample is converted. numpy only, except resampling
(``scipy.signal.resample_poly``, the ``pipeline`` extra).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.pipeline.micro_frontend import backend as micro_backend
from edgesdk.pipeline.micro_frontend import frame_count as micro_frame_count
from edgesdk.pipeline.micro_frontend import micro_features
from edgesdk.schemas.pipeline import AudioPre, Framing, LogMel, Pipeline

WAV_TYPES = ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave")
PCM_TYPE = "audio/pcm"
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
_WIDTHS = {(_PCM, 16): "<i2", (_PCM, 32): "<i4", (_FLOAT, 32): "<f4"}
#: Largest up/down factor resampled: resample_poly's filter has 20 × max(up, down) taps, so an
#: odd rate (44101 Hz → 16 kHz is 16000/44101) would cost millions of taps per request.
MAX_RESAMPLE_FACTOR = 2048


@dataclass(frozen=True)
class Pcm:
    """Undecoded samples: a view of the body's data chunk and how to read it."""

    data: memoryview
    rate: int
    channels: int
    dtype: str  # numpy dtype string, little-endian

    @property
    def frames(self) -> int:
        return len(self.data) // (self.channels * np.dtype(self.dtype).itemsize)


def open_audio(data: bytes, media_type: str, pre: AudioPre) -> Pcm:
    """The body's samples (not yet converted), their declared size checked first."""
    if media_type in WAV_TYPES:
        pcm = _parse_wav(memoryview(data), pre.max_bytes)
    elif media_type == PCM_TYPE and pre.pcm is not None:
        if len(data) > pre.max_bytes:
            raise PipelineInputError(413, f"audio of {len(data)} bytes; this model's pipeline allows {pre.max_bytes}")
        if len(data) % (2 * pre.pcm.channels):
            raise PipelineInputError(400, f"raw PCM of {len(data)} bytes is not whole 16-bit frames")
        pcm = Pcm(memoryview(data), pre.pcm.rate, pre.pcm.channels, "<i2")
    else:
        accepted = " or ".join(["audio/wav", *([PCM_TYPE] if pre.pcm is not None else [])])
        raise PipelineInputError(415, f"Content-Type {media_type!r} is not audio this model takes; use {accepted}")
    if pcm.frames == 0:
        raise PipelineInputError(400, "the audio has no samples")
    return pcm


def _parse_wav(body: memoryview, max_bytes: int) -> Pcm:
    if len(body) < 12 or body[:4] != b"RIFF" or body[8:12] != b"WAVE":
        raise PipelineInputError(400, "not a valid WAV file: no RIFF/WAVE header")
    fmt: tuple[int, int, int, int] | None = None
    at = 12
    while at + 8 <= len(body):
        kind, size = bytes(body[at : at + 4]), struct.unpack_from("<I", body, at + 4)[0]
        start = at + 8
        if kind == b"fmt ":
            fmt = _read_fmt(body[start : start + size])
        elif kind == b"data":
            if fmt is None:
                raise PipelineInputError(400, "not a valid WAV file: its data chunk comes before its fmt chunk")
            return _data_chunk(body, start, size, fmt, max_bytes)
        at = start + size + (size & 1)  # chunks are padded to even sizes
    raise PipelineInputError(400, "not a valid WAV file: no data chunk")


def _read_fmt(chunk: memoryview) -> tuple[int, int, int, int]:
    if len(chunk) < 16:
        raise PipelineInputError(400, f"not a valid WAV file: fmt chunk of {len(chunk)} bytes")
    tag, channels, rate, _, block_align, bits = struct.unpack_from("<HHIIHH", chunk)
    if tag == _EXTENSIBLE and len(chunk) >= 26:
        tag = struct.unpack_from("<H", chunk, 24)[0]  # the sub-format GUID starts with the format tag
    if (tag, bits) not in _WIDTHS:
        raise PipelineInputError(
            400, f"WAV format {tag} with {bits}-bit samples is not supported; send 16/32-bit PCM or 32-bit float"
        )
    if not 1 <= channels <= 16 or not 1000 <= rate <= 384_000 or block_align != channels * bits // 8:
        raise PipelineInputError(
            400, f"not a valid WAV file: {channels} channels at {rate} Hz, block align {block_align}"
        )
    return tag, channels, rate, bits


def _data_chunk(body: memoryview, start: int, size: int, fmt: tuple[int, int, int, int], max_bytes: int) -> Pcm:
    tag, channels, rate, bits = fmt
    if size > max_bytes:
        raise PipelineInputError(
            413,
            f"WAV declares {size} bytes of samples; this model's pipeline allows {max_bytes} (refused before reading)",
        )
    if start + size > len(body):
        raise PipelineInputError(
            400, f"WAV declares {size} bytes of samples and carries {len(body) - start}: truncated"
        )
    frame = channels * bits // 8
    return Pcm(body[start : start + size - size % frame], rate, channels, _WIDTHS[(tag, bits)])


def step_backends(pipeline: Pipeline | None) -> dict[str, str]:
    """{step: its implementation} where the pipeline's step has more than one (the model's info
    shows it): ``micro_frontend`` runs pymicro-features' C code or its numpy twin."""
    if pipeline is None or pipeline.input != "audio" or pipeline.audio.micro_frontend is None:
        return {}
    return {"micro_frontend": micro_backend(pipeline.audio.micro_frontend, pipeline.audio.sample_rate)}


def decoded_nbytes(pcm: Pcm, pre: AudioPre) -> int:
    """float32 samples at the source rate, the resampled mono copy and its features (×2 working)."""
    resampled = math.ceil(pcm.frames * pre.sample_rate / pcm.rate)
    kept = pre.length if pre.length is not None else resampled
    return pcm.frames * pcm.channels * 4 + resampled * 4 * 2 + kept * 4 + feature_count(kept, pre) * 4


def feature_count(samples: int, pre: AudioPre) -> int:
    if pre.micro_frontend is not None:  # its int64 working arrays: ~40 values per spectrum bin
        return micro_frame_count(samples, pre.micro_frontend, pre.sample_rate) * 1024 * 2
    if pre.log_mel is not None:
        return _frame_count(samples, pre.log_mel.n_fft, pre.log_mel.hop) * pre.log_mel.n_mels
    if pre.framing is not None:
        return _frame_count(samples, pre.framing.length, pre.framing.hop) * pre.framing.length
    return 0


def to_tensor(pcm: Pcm, pre: AudioPre, dtype: np.dtype[np.generic], rank: int | None) -> np.ndarray:
    """Decode and run the pipeline's audio steps in their fixed order; a batch of one, or with
    ``stream`` one batch of one per call stacked on a leading axis (``stream_chunks``)."""
    if pre.micro_frontend is not None and pcm.dtype == "<i2" and pcm.channels == 1 and pcm.rate == pre.sample_rate:
        samples = np.frombuffer(pcm.data, "<i2")  # the frontend takes these 16-bit samples: no float round trip
    else:
        samples = resample(waveform(pcm), pcm.rate, pre.sample_rate)
    if pre.length is not None:
        samples = pad_or_trim(samples, pre.length)
    if pre.micro_frontend is not None:
        features = micro_features(samples, pre.sample_rate, pre.micro_frontend)
    elif pre.log_mel is not None:
        features = log_mel(samples, pre.sample_rate, pre.log_mel)
    elif pre.framing is not None:
        features = frames(samples, pre.framing)
    else:
        features = samples
    if pre.stream is not None:
        return stream_chunks(features, pre, rank).astype(dtype, copy=False)
    tensor = features[None]
    while rank is not None and tensor.ndim < rank:  # e.g. (1, frames, mels) → (1, 1, frames, mels)
        tensor = tensor[:, None]
    return tensor.astype(dtype, copy=False)


def stream_chunks(features: np.ndarray, pre: AudioPre, rank: int | None) -> np.ndarray:
    """(calls, 1, frames, features): whole chunks of ``stream.frames`` feature frames, the last
    partial one dropped (as a streaming detector waits for a whole chunk), each a batch of one."""
    per_call = pre.stream.frames if pre.stream is not None else features.shape[0]
    calls = features.shape[0] // per_call
    if calls == 0:
        raise PipelineInputError(
            422,
            f"the audio is too short for one call of this streaming model: send at least {_min_ms(pre, per_call)} ms",
        )
    limit = pre.stream.max_calls if pre.stream is not None else 1
    if calls > limit:
        raise PipelineInputError(
            413, f"the audio makes {calls} calls of this streaming model; its pipeline allows {limit}"
        )
    chunks = features[: calls * per_call].reshape(calls, 1, per_call, *features.shape[1:])
    while rank is not None and chunks.ndim - 1 < rank:
        chunks = chunks[:, :, None]
    return chunks


def _min_ms(pre: AudioPre, frames: int) -> int:
    """The audio that makes ``frames`` feature frames."""
    if pre.micro_frontend is not None:
        return pre.micro_frontend.window_ms + (frames - 1) * pre.micro_frontend.step_ms
    spec = pre.log_mel or LogMel()
    return math.ceil((spec.n_fft + (frames - 1) * spec.hop) * 1000 / pre.sample_rate)


def waveform(pcm: Pcm) -> np.ndarray:
    """Mono float32 in [-1, 1): integer PCM scaled by its full range, channels averaged."""
    raw = np.frombuffer(pcm.data, dtype=pcm.dtype).reshape(-1, pcm.channels)
    if raw.dtype.kind == "i":
        samples = raw.astype(np.float32) / np.float32(-float(np.iinfo(raw.dtype).min))
    else:
        samples = raw.astype(np.float32)
        if not np.isfinite(samples).all():
            raise PipelineInputError(400, "the WAV's float samples hold NaN or Inf")
    return samples.mean(axis=1, dtype=np.float32) if pcm.channels > 1 else samples[:, 0]


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Polyphase resampling (scipy's resample_poly, its default Kaiser window) to ``target`` Hz."""
    if rate == target:
        return samples
    resample_poly = _resample_poly()
    divisor = math.gcd(rate, target)
    up, down = target // divisor, rate // divisor
    if max(up, down) > MAX_RESAMPLE_FACTOR:
        raise PipelineInputError(
            422,
            f"audio at {rate} Hz resamples to {target} Hz only as {up}/{down}; send a common rate (8/16/22.05/44.1/48 kHz)",
        )
    return resample_poly(samples, up, down).astype(np.float32)


def _resample_poly() -> Callable[..., np.ndarray]:
    try:
        from scipy.signal import resample_poly
    except ImportError:
        raise PipelineInputError(
            501, "this install cannot resample audio: install it with pip install 'edgesdk[pipeline]' (scipy)"
        ) from None
    return resample_poly  # type: ignore[no-any-return]


def pad_or_trim(samples: np.ndarray, length: int) -> np.ndarray:
    if samples.size >= length:
        return samples[:length]
    return np.concatenate([samples, np.zeros(length - samples.size, samples.dtype)])


def _frame_count(samples: int, length: int, hop: int) -> int:
    return 1 + max(samples - length, 0) // hop


def _windows(samples: np.ndarray, length: int, hop: int) -> np.ndarray:
    """(frames, length) views every ``hop`` samples; a short input is zero-padded to one frame."""
    if samples.size < length:
        samples = pad_or_trim(samples, length)
    return np.lib.stride_tricks.sliding_window_view(samples, length)[::hop]


WINDOWS: dict[str, Callable[[int], np.ndarray]] = {
    "hann": lambda n: np.hanning(n + 1)[:-1],  # periodic, as STFTs use
    "hamming": lambda n: np.hamming(n + 1)[:-1],
    "none": lambda n: np.ones(n),
}


def frames(samples: np.ndarray, framing: Framing) -> np.ndarray:
    return _windows(samples, framing.length, framing.hop) * WINDOWS[framing.window](framing.length).astype(np.float32)


def log_mel(samples: np.ndarray, rate: int, spec: LogMel) -> np.ndarray:
    """(frames, n_mels), or (n_mels, frames) with ``layout: mels_frames``; float32."""
    windowed = _windows(samples.astype(np.float64), spec.n_fft, spec.hop) * WINDOWS["hann"](spec.n_fft)
    power = np.abs(np.fft.rfft(windowed, n=spec.n_fft, axis=-1)) ** 2
    mel = power @ mel_filters(rate, spec).T
    out = np.log(mel + spec.log_offset).astype(np.float32)
    return out.T.copy() if spec.layout == "mels_frames" else out


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def mel_filters(rate: int, spec: LogMel) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters, evenly spaced on the HTK mel scale."""
    fmax = spec.fmax if spec.fmax is not None else rate / 2
    edges_mel = np.linspace(_hz_to_mel(np.array(spec.fmin)), _hz_to_mel(np.array(fmax)), spec.n_mels + 2)
    edges = 700.0 * (10.0 ** (edges_mel / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(spec.n_fft, 1.0 / rate)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - lower) / (centre - lower)
    falling = (upper - bins) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling))
