"""The TFLite-Micro audio frontend ("micro frontend") in numpy: 16-bit samples → uint16 features.

What microWakeWord's keyword spotters are trained on and what pymicro-features (its C code)
computes on the host: a Hann window of ``window_ms`` every ``step_ms``, a 16-bit fixed-point
FFT, a triangular mel filterbank (square-rooted energies), per-channel noise reduction, PCAN
gain control and an integer log. Every stage is the reference's integer arithmetic, vectorised
over frames; only the noise estimate runs frame by frame (each frame updates it). The FFT is
numpy's float FFT rounded to the reference's int16 outputs (kiss_fft in 16-bit fixed point
rounds at each of its stages): the one place the two can differ, by a unit of the spectrum —
tests/unit/test_pipeline_micro_frontend.py measures how far that moves the features.

Where pymicro-features is installed (the ``pipeline`` extra, on the platforms it has wheels for)
and the step asks for its fixed configuration (the defaults, 16 kHz), its C code computes the
same features bit for bit in a fifth of the time (1.2 vs 7.2 ms for a 1.4 s WAV): it is used
then, this numpy code otherwise. ``backend`` says which one a step runs on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from edgesdk.schemas.pipeline import MicroFrontend

_WINDOW_BITS = 12  # the window's coefficients are Q12
_FILTERBANK_BITS = 12  # the filterbank's weights are Q12
_NOISE_REDUCTION_BITS = 14  # smoothing factors are Q14
_PCAN_SNR_BITS, _PCAN_OUTPUT_BITS = 12, 6
_LOG_SCALE_BITS, _LOG_SEGMENT_BITS, _LOG_COEFF = 16, 7, 45426  # log2 in Q16; 45426 = ln(2) in Q16
#: log2(1 + x) - x on [0, 1) in 128 segments, Q16 (the reference's table, the Mitchell correction).
_LOG_LUT = np.array(
    [0, 224, 442, 654, 861, 1063, 1259, 1450, 1636, 1817, 1992, 2163, 2329, 2490, 2646, 2797, 2944, 3087, 3224, 3358]
    + [3487, 3611, 3732, 3848, 3960, 4068, 4172, 4272, 4368, 4460, 4549, 4633, 4714, 4791, 4864, 4934, 5001, 5063]
    + [5123, 5178, 5231, 5280, 5326, 5368, 5408, 5444, 5477, 5507, 5533, 5557, 5578, 5595, 5610, 5622, 5631, 5637]
    + [5640, 5641, 5638, 5633, 5626, 5615, 5602, 5586, 5568, 5547, 5524, 5498, 5470, 5439, 5406, 5370, 5332, 5291]
    + [5249, 5203, 5156, 5106, 5054, 5000, 4944, 4885, 4825, 4762, 4697, 4630, 4561, 4490, 4416, 4341, 4264, 4184]
    + [4103, 4020, 3935, 3848, 3759, 3668, 3575, 3481, 3384, 3286, 3186, 3084, 2981, 2875, 2768, 2659, 2549, 2437]
    + [2323, 2207, 2090, 1971, 1851, 1729, 1605, 1480, 1353, 1224, 1094, 963, 830, 695, 559, 421, 282, 142, 0, 0],
    dtype=np.int64,
)


@dataclass(frozen=True)
class _Plan:
    """What the reference computes once per configuration: window, FFT size, filterbank, gain table."""

    size: int
    step: int
    fft_size: int
    window: np.ndarray  # int64 Q12
    gain_lut: np.ndarray  # int64, PCAN's piecewise-quadratic gain table
    taps: tuple[np.ndarray, np.ndarray, np.ndarray]  # the filterbank as (bins, Q12 weights, each channel's first)
    snr_shift: int
    correction_bits: int


def frame_count(samples: int, spec: MicroFrontend, rate: int) -> int:
    size, step = spec.window_ms * rate // 1000, spec.step_ms * rate // 1000
    return 0 if samples < size else 1 + (samples - size) // step


#: pymicro-features builds its frontend with no arguments: these settings, at this rate.
_NATIVE_SPEC, _NATIVE_RATE = MicroFrontend(), 16000
_NATIVE_CHUNK = 320  # bytes: its process_samples takes at least 10 ms of 16-bit samples per call
NATIVE, NUMPY = "pymicro-features", "numpy"


def backend(spec: MicroFrontend, rate: int) -> str:
    """Which implementation ``micro_features`` runs for this step: the C one where it can."""
    return NATIVE if rate == _NATIVE_RATE and spec == _NATIVE_SPEC and _native() is not None else NUMPY


def micro_features(samples: np.ndarray, rate: int, spec: MicroFrontend) -> np.ndarray:
    """(frames, channels) float32: the uint16 features × ``spec.output_scale``. ``samples`` are
    int16 (or float in [-1, 1), rounded to int16 as the reference takes them)."""
    pcm = samples if samples.dtype == np.int16 else _to_int16(samples)
    if backend(spec, rate) == NATIVE:
        return native_micro_features(pcm)
    return numpy_micro_features(pcm, rate, spec)


def native_micro_features(pcm: np.ndarray) -> np.ndarray:
    """pymicro-features' C frontend over int16 ``pcm`` at 16 kHz with the default settings, fed
    as pymicro-wakeword feeds it; its features are already the uint16 values / 25.6."""
    functions = _native()
    if functions is None:
        raise RuntimeError("pymicro-features is not installed: pip install 'edgesdk[pipeline]'")
    create, process = functions
    frontend, rows, at = create(), [], 0
    data = pcm.astype("<i2", copy=False).tobytes()
    while len(data) - at >= _NATIVE_CHUNK:
        features, read = process(frontend, data[at : at + 2 * _NATIVE_CHUNK])
        at += read * 2
        if features:
            rows.append(features)
    return np.array(rows, np.float32).reshape(-1, _NATIVE_SPEC.channels)


@lru_cache(maxsize=1)
def _native() -> tuple[Any, Any] | None:
    try:  # the module pymicro-features wraps: its MicroFrontend class adds a dataclass per call
        from micro_features_cpp import create_frontend, process_samples
    except ImportError:
        return None
    return create_frontend, process_samples


def numpy_micro_features(pcm: np.ndarray, rate: int, spec: MicroFrontend) -> np.ndarray:
    """The reference's arithmetic in numpy, for any settings: int16 ``pcm`` → (frames, channels)."""
    plan = _plan(spec, rate)
    count = frame_count(pcm.size, spec, rate)
    if count == 0:
        return np.zeros((0, spec.channels), np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(pcm, plan.size)[:: plan.step][:count]
    windowed = (windows.astype(np.int64) * plan.window) >> _WINDOW_BITS
    # Per frame, the shift that gives the FFT its whole range. The reference negates in int16,
    # where -32768 stays negative: such a sample does not count towards the largest magnitude.
    magnitudes = np.where(windowed == -32768, 0, np.abs(windowed))
    shift = 15 - _bit_length(magnitudes.max(axis=1))
    real, imag = _fixed_point_rfft((windowed << shift[:, None]).astype(np.int16), plan.fft_size)
    real, imag = real.astype(np.int64), imag.astype(np.int64)
    energy = real * real + imag * imag
    signal = _filterbank_sqrt(energy, plan) >> shift[:, None]
    signal = _reduce_noise(signal, spec, plan)
    return (_log_scale(signal, spec, plan) * np.float32(spec.output_scale)).astype(np.float32)


def _to_int16(samples: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)


def _bit_length(values: np.ndarray) -> np.ndarray:
    """The reference's MostSignificantBit32: the bit length (0 for 0)."""
    out = np.zeros(values.shape, np.int64)
    nonzero = values > 0
    out[nonzero] = np.floor(np.log2(values[nonzero].astype(np.float64))).astype(np.int64) + 1
    return out


def _fixed_point_rfft(frames: np.ndarray, fft_size: int) -> tuple[np.ndarray, np.ndarray]:
    """kiss_fftr in 16-bit fixed point (the reference's FFT), bit for bit: (real, imag) int16
    arrays of (frames, fft_size // 2 + 1). The real input is read as fft_size / 2 complex
    samples, transformed by radix-4 stages that each divide by 4 and round, then split into
    the real spectrum with a last halving. A float FFT rounded once differs from it: the
    stages' rounding zeroes the quietest bins, which the integer log then maps to 0. Values
    live in int16 arrays, so sums wrap where the C code's int16 fields do; products in int32."""
    half = fft_size // 2
    padded = np.zeros((frames.shape[0], fft_size), np.int16)
    padded[:, : frames.shape[1]] = frames
    re, im = _complex_fft(padded[:, 0::2], padded[:, 1::2], _twiddles(half))
    k = np.arange(1, half // 2 + 1)
    fpk_re, fpk_im = _fixdiv(re[:, k], 2), _fixdiv(im[:, k], 2)
    fpnk_re, fpnk_im = _fixdiv(re[:, half - k], 2), _fixdiv(-im[:, half - k], 2)
    f1_re, f1_im = fpk_re + fpnk_re, fpk_im + fpnk_im
    tw_re, tw_im = _cmul(fpk_re - fpnk_re, fpk_im - fpnk_im, *_super_twiddles(half))
    f1_re, f1_im, tw_re, tw_im = (x.astype(np.int32) for x in (f1_re, f1_im, tw_re, tw_im))
    out_re = np.zeros((frames.shape[0], half + 1), np.int16)
    out_im = np.zeros_like(out_re)
    dc_re, dc_im = _fixdiv(re[:, 0], 2).astype(np.int32), _fixdiv(im[:, 0], 2).astype(np.int32)
    out_re[:, 0], out_re[:, half] = (dc_re + dc_im).astype(np.int16), (dc_re - dc_im).astype(np.int16)
    out_re[:, k], out_im[:, k] = ((f1_re + tw_re) >> 1).astype(np.int16), ((f1_im + tw_im) >> 1).astype(np.int16)
    out_re[:, half - k] = ((f1_re - tw_re) >> 1).astype(np.int16)
    out_im[:, half - k] = ((tw_im - f1_im) >> 1).astype(np.int16)
    return out_re, out_im


def _complex_fft(re: np.ndarray, im: np.ndarray, tw: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """kiss_fft's decimation in time for a power of 4 (radix-4 butterflies), fixed point: the
    recursion unrolled into stages over every frame at once, the input in base-4 digit-reversed
    order so each stage's four quarter-size transforms sit side by side."""
    frames, n = re.shape
    stages = round(math.log(n, 4))
    if 4**stages != n:
        raise ValueError(f"the micro frontend's FFT takes powers of 4 complex points, not {n}")
    order = _digit_reversed(n)
    re, im = re[:, order], im[:, order]
    size = 4
    while size <= n:
        m, stride = size // 4, n // size
        quarters_re = _fixdiv(re.reshape(frames, stride, 4, m), 4)
        quarters_im = _fixdiv(im.reshape(frames, stride, 4, m), 4)
        a_re, b_re, c_re, d_re = (quarters_re[:, :, q] for q in range(4))
        a_im, b_im, c_im, d_im = (quarters_im[:, :, q] for q in range(4))
        k = np.arange(m) * stride
        s0_re, s0_im = _cmul(b_re, b_im, tw[0][k], tw[1][k])
        s1_re, s1_im = _cmul(c_re, c_im, tw[0][2 * k], tw[1][2 * k])
        s2_re, s2_im = _cmul(d_re, d_im, tw[0][3 * k], tw[1][3 * k])
        s5_re, s5_im = a_re - s1_re, a_im - s1_im
        a_re, a_im = a_re + s1_re, a_im + s1_im
        s3_re, s3_im = s0_re + s2_re, s0_im + s2_im
        s4_re, s4_im = s0_re - s2_re, s0_im - s2_im
        re = np.stack([a_re + s3_re, s5_re + s4_im, a_re - s3_re, s5_re - s4_im], axis=2).reshape(frames, n)
        im = np.stack([a_im + s3_im, s5_im - s4_re, a_im - s3_im, s5_im + s4_re], axis=2).reshape(frames, n)
        size *= 4
    return re, im


@lru_cache(maxsize=4)
def _digit_reversed(n: int) -> np.ndarray:
    """Where each input sample sits at the bottom of the radix-4 recursion."""
    index, digits = np.arange(n), round(math.log(n, 4))
    out = np.zeros(n, np.int64)
    for _ in range(digits):
        out, index = out * 4 + index % 4, index // 4
    return out


def _wrap16(x: np.ndarray) -> np.ndarray:
    """A store into an int16 field: keep the low 16 bits, sign-extended (int64 ``x``)."""
    return (x << 48) >> 48


def _round15(x: np.ndarray) -> np.ndarray:
    """kiss_fft's sround: an int32 Q15 product back to int16, rounded."""
    return ((x + (1 << 14)) >> 15).astype(np.int16)


def _fixdiv(x: np.ndarray, divisor: int) -> np.ndarray:
    return _round15(x.astype(np.int32) * (0x7FFF // divisor))


def _cmul(a_re: np.ndarray, a_im: np.ndarray, b_re: np.ndarray, b_im: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C_MUL: int16 ``a`` times int32 twiddles ``b``, its int32 products wrapping as C's do."""
    a_re, a_im = a_re.astype(np.int32), a_im.astype(np.int32)
    return _round15(a_re * b_re - a_im * b_im), _round15(a_re * b_im + a_im * b_re)


@lru_cache(maxsize=4)
def _twiddles(n: int) -> tuple[np.ndarray, np.ndarray]:
    return _unit_circle(-2 * math.pi * np.arange(n) / n)


@lru_cache(maxsize=4)
def _super_twiddles(half: int) -> tuple[np.ndarray, np.ndarray]:
    return _unit_circle(-math.pi * (np.arange(1, half // 2 + 1) / half + 0.5))


def _unit_circle(phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q15 (cos, sin), rounded as kiss_fft rounds its twiddles."""
    return np.floor(0.5 + 0x7FFF * np.cos(phase)).astype(np.int32), np.floor(0.5 + 0x7FFF * np.sin(phase)).astype(
        np.int32
    )


def _filterbank_sqrt(energy: np.ndarray, plan: _Plan) -> np.ndarray:
    """Each channel's weighted energy, square-rooted: a channel sums its own bins by their rising
    weights and the previous band's bins by their falling ones (sparse: a few bins each)."""
    bins, coefficients, starts = plan.taps
    sums = np.add.reduceat(energy[:, bins] * coefficients, starts, axis=1)
    return _rounded_sqrt(sums.astype(np.uint64))


def _rounded_sqrt(values: np.ndarray) -> np.ndarray:
    """The integer square root of uint64 ``values`` rounded as the reference does (up when the
    remainder exceeds the root); int64 out."""
    root = np.floor(np.sqrt(values.astype(np.float64))).astype(np.uint64)
    root = np.minimum(root, np.uint64(0xFFFFFFFF))
    root -= (root * root > values).astype(np.uint64)  # float sqrt of a 64-bit integer may land one off
    root += ((root + 1) * (root + 1) <= values).astype(np.uint64) * (root < 0xFFFFFFFF)
    # Below 2^32 the reference's 32-bit root stays within 16 bits: no rounding up from 0xFFFF.
    capped = (values < np.uint64(1 << 32)) & (root == 0xFFFF)
    up = ((values - root * root) > root) & ~capped & (root < 0xFFFFFFFF)
    return (root + up.astype(np.uint64)).astype(np.int64)


def _reduce_noise(signal: np.ndarray, spec: MicroFrontend, plan: _Plan) -> np.ndarray:
    """Subtract each channel's running noise estimate (kept above a floor), then PCAN gain."""
    one = 1 << _NOISE_REDUCTION_BITS
    smoothing = np.where(np.arange(spec.channels) % 2 == 0, spec.even_smoothing, spec.odd_smoothing)
    smoothing = (smoothing * one).astype(np.int64)  # C truncates the float to its integer field
    keep = int(spec.min_signal_remaining * one)
    scaled = (signal << spec.smoothing_bits) & 0xFFFFFFFF
    estimates = np.empty_like(signal)
    estimate = np.zeros(spec.channels, np.int64)
    incoming, keep_old = scaled * smoothing, one - smoothing
    for row in range(len(scaled)):  # the estimate carries from frame to frame: 3 numpy calls a frame
        estimate = (incoming[row] + estimate * keep_old) >> _NOISE_REDUCTION_BITS
        estimates[row] = estimate
    floor = (signal * keep) >> _NOISE_REDUCTION_BITS
    out = np.maximum((scaled - np.minimum(estimates, scaled)) >> spec.smoothing_bits, floor)
    if not spec.pcan:
        return out
    gain = _wide_dynamic(estimates, plan.gain_lut)
    return _pcan_shrink((out * gain) >> plan.snr_shift)


def _wide_dynamic(x: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """The gain for noise estimate ``x``: a quadratic per power-of-two interval of the table."""
    interval = _bit_length(x)
    at = np.maximum(4 * interval - 6, 0)
    frac = np.where(interval < 11, x << np.maximum(11 - interval, 0), x >> np.maximum(interval - 11, 0)) & 0x3FF
    result = (lut[at + 2] * frac) >> 5
    result = (result + (lut[at + 1] << 5)) * frac
    result = _wrap16(((result + (1 << 14)) >> 15) + lut[at])
    return np.where(x <= 2, lut[np.minimum(x, 2)], result) & 0xFFFFFFFF


def _pcan_shrink(snr: np.ndarray) -> np.ndarray:
    snr = snr & 0xFFFFFFFF
    low = (snr * snr) >> (2 + 2 * _PCAN_SNR_BITS - _PCAN_OUTPUT_BITS)
    high = (snr >> (_PCAN_SNR_BITS - _PCAN_OUTPUT_BITS)) - (1 << _PCAN_OUTPUT_BITS)
    return np.where(snr < (2 << _PCAN_SNR_BITS), low, high) & 0xFFFFFFFF


def _log_scale(signal: np.ndarray, spec: MicroFrontend, plan: _Plan) -> np.ndarray:
    """uint16 features: the natural log in Q``scale_shift`` (0 for signals of 0 or 1)."""
    bits = plan.correction_bits
    value = ((signal << bits) if bits >= 0 else (signal >> -bits)) & 0xFFFFFFFF
    if not spec.log:
        return np.minimum(value, 0xFFFF)
    integer = np.maximum(_bit_length(value) - 1, 0)
    frac = value - (np.int64(1) << integer)
    up, down = np.maximum(_LOG_SCALE_BITS - integer, 0), np.maximum(integer - _LOG_SCALE_BITS, 0)
    frac = np.where(integer < _LOG_SCALE_BITS, frac << up, frac >> down)
    segment = frac >> (_LOG_SCALE_BITS - _LOG_SEGMENT_BITS)
    c0, c1 = _LOG_LUT[segment], _LOG_LUT[segment + 1]
    unit = (1 << _LOG_SCALE_BITS) >> _LOG_SEGMENT_BITS
    log2 = (integer << _LOG_SCALE_BITS) + frac + c0 + (((c1 - c0) * (frac - unit * segment)) >> _LOG_SCALE_BITS)
    half = 1 << (_LOG_SCALE_BITS - 1)
    loge = (_LOG_COEFF * log2 + half) >> _LOG_SCALE_BITS
    scaled = ((loge << spec.scale_shift) + half) >> _LOG_SCALE_BITS
    return np.where(value > 1, np.minimum(scaled, 0xFFFF), 0)


@lru_cache(maxsize=8)
def _plan(spec: MicroFrontend, rate: int) -> _Plan:
    size, step = spec.window_ms * rate // 1000, spec.step_ms * rate // 1000
    fft_size = 1 << max(size - 1, 1).bit_length()
    # The reference build takes the cosine in float32 (cosf of a float32 angle): the double
    # cosine rounds one of the 480 coefficients the other way.
    angle = (float(np.float32(2.0 * math.pi / size)) * (np.arange(size) + 0.5)).astype(np.float32)
    cosine = np.cos(angle.astype(np.float64)).astype(np.float32)
    shape = (0.5 - 0.5 * cosine.astype(np.float64)).astype(np.float32)
    window = np.floor(shape.astype(np.float64) * (1 << _WINDOW_BITS) + 0.5)
    weights, unweights = _filterbank(spec, rate, fft_size // 2 + 1)
    taps = _taps(weights, unweights)
    correction = fft_size.bit_length() - 1 - _FILTERBANK_BITS // 2
    return _Plan(
        size=size,
        step=step,
        fft_size=fft_size,
        window=window.astype(np.int64),
        taps=taps,
        gain_lut=_gain_table(spec, spec.smoothing_bits - correction),
        snr_shift=spec.gain_bits - correction - _PCAN_SNR_BITS,
        correction_bits=correction,
    )


def _mel(hz: float | np.floating[Any]) -> np.float32:
    """The mel scale in float32 throughout, as the reference build computes it (log1pf): the
    double-precision formula moves three of the 40-band weights by one unit."""
    return np.float32(np.float32(1127.0) * np.log1p(np.float32(hz) / np.float32(700.0)))


def _filterbank(spec: MicroFrontend, rate: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Each band's bins with their rising (weights) and falling (unweights) Q12 slopes, in the
    reference's float32 arithmetic so the band edges fall on the same bins."""
    channels = spec.channels + 1
    low, high = _mel(spec.lower_hz), _mel(spec.upper_hz)
    spacing = np.float32((high - low) / np.float32(channels))
    centres = [np.float32(low + spacing * np.float32(i + 1)) for i in range(channels)]
    hz_per_bin = np.float32(0.5 * rate / (np.float32(bins) - 1))
    weights = np.zeros((channels, bins))
    unweights = np.zeros((channels, bins))
    start = int(1.5 + spec.lower_hz / float(hz_per_bin))  # DC always left out
    for chan, centre in enumerate(centres):
        below = low if chan == 0 else centres[chan - 1]
        freq = start
        while freq < bins and _mel(np.float32(freq * hz_per_bin)) <= centre:
            weight = np.float32((centre - _mel(np.float32(freq * hz_per_bin))) / np.float32(centre - below))
            weights[chan, freq] = math.floor(float(weight) * (1 << _FILTERBANK_BITS) + 0.5)
            unweights[chan, freq] = math.floor((1.0 - float(weight)) * (1 << _FILTERBANK_BITS) + 0.5)
            freq += 1
        start = freq
    return weights, unweights


def _taps(weights: np.ndarray, unweights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output channel k sums band k + 1's bins by their weights and band k's by their
    unweights: every (bin, coefficient) of each channel in one flat list, and where each starts.
    A channel with no bin keeps one zero tap (reduceat needs a non-empty segment)."""
    bins: list[int] = []
    coefficients: list[int] = []
    starts: list[int] = []
    for channel in range(weights.shape[0] - 1):
        starts.append(len(bins))
        rising, falling = np.nonzero(weights[channel + 1])[0], np.nonzero(unweights[channel])[0]
        bins += [*falling.tolist(), *rising.tolist()] or [0]
        coefficients += [*unweights[channel, falling].tolist(), *weights[channel + 1, rising].tolist()] or [0]
    return np.array(bins), np.array(coefficients, np.int64), np.array(starts)


def _gain_table(spec: MicroFrontend, input_bits: int) -> np.ndarray:
    """PCAN's gain ``2^gain_bits × (x + offset)^-strength`` as quadratics per power of two."""

    def gain(x: int) -> int:
        value = np.float32(1 << spec.gain_bits) * np.power(
            np.float32(np.float32(x) / np.float32(1 << input_bits) + np.float32(spec.pcan_offset)),
            np.float32(-spec.pcan_strength),
        )
        return 0x7FFF if value > 0x7FFF else int(np.float32(value + np.float32(0.5)))

    lut = np.zeros(4 * 32 - 3, np.int64)
    lut[0], lut[1] = gain(0), gain(1)
    for interval in range(2, 33):
        x0 = 1 << (interval - 1)
        x1, x2 = x0 + (x0 >> 1), (x0 + (x0 - 1)) if interval == 32 else 2 * x0
        y0, y1, y2 = gain(x0), gain(x1), gain(x2)
        a1 = 4 * (y1 - y0) - (y2 - y0)
        lut[4 * interval - 6 : 4 * interval - 3] = [y0, _int16(a1), _int16(y2 - y0 - a1)]
    return lut


def _int16(value: int) -> int:
    """C's cast to int16_t: wrap around."""
    return (value + 0x8000) % 0x10000 - 0x8000
