"""Sampled data capture on the device (agent/capture/): sampling, the bounded queue, the disk
budget, the retention, the redaction hook and the sealed file format (issue 41)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from edgesdk.agent.capture.budget import capture_files, enforce
from edgesdk.agent.capture.start import operator_key, redaction_hook
from edgesdk.agent.capture.writer import CaptureWriter, _Sample

from edgesdk.capture.record import unpack_record
from edgesdk.capture.sealed import CaptureFileError, open_sealed, seal
from edgesdk.errors import ConfigError
from edgesdk.schemas.agent_config import CaptureConfig

FEEDS = {"image": np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) + 0.5}
OUTPUTS = {"logits": np.linspace(-1, 1, 10, dtype=np.float32)[None]}


def _writer(tmp_path: Path, key: X25519PrivateKey, **kwargs: Any) -> CaptureWriter:
    settings = {"rate": 1.0, "max_bytes": 1 << 20, "retention_s": 3600.0, **kwargs}
    writer = CaptureWriter(tmp_path / "capture", key.public_key(), **settings)
    writer.directory.mkdir(parents=True)
    return writer


def _sample(at: float | None = None) -> _Sample:
    return _Sample("digits", FEEDS, OUTPUTS, "onnx-fp32", time.time() if at is None else at)


def test_capture_samples_the_configured_share_of_answers(tmp_path: Path) -> None:
    draws = iter([0.0, 0.5, 0.2, 0.9, 0.05])  # rate 0.25: the 1st, 3rd and 5th are taken
    writer = _writer(tmp_path, X25519PrivateKey.generate(), rate=0.25, draw=lambda: next(draws))
    for _ in range(5):
        writer.tap("digits", FEEDS, OUTPUTS, "onnx-fp32")
    assert (writer.counts.seen, writer.counts.sampled, writer.counts.dropped) == (5, 3, 0)


def test_capture_queue_full_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    writer = _writer(tmp_path, X25519PrivateKey.generate(), queue_size=2)  # no worker: nothing drains it
    started = time.perf_counter()
    for _ in range(50):
        writer.tap("digits", FEEDS, OUTPUTS, "onnx-fp32")
    assert time.perf_counter() - started < 0.5
    assert (writer.counts.sampled, writer.counts.dropped) == (2, 48)


def test_capture_counts_survive_concurrent_taps(tmp_path: Path) -> None:
    writer = _writer(tmp_path, X25519PrivateKey.generate(), queue_size=1)

    def hammer() -> None:
        for _ in range(2000):
            writer.tap("digits", FEEDS, OUTPUTS, "onnx-fp32")

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert writer.counts.seen == 8000 and writer.counts.sampled + writer.counts.dropped == 8000


def test_capture_file_opens_only_with_the_operator_key(tmp_path: Path) -> None:
    key, other = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    sample = _sample()
    sample.about = {"release": 3}
    path = _writer(tmp_path, key).write(sample)
    assert path is not None and path.parent.name == "capture" and oct(path.stat().st_mode & 0o777) == "0o600"
    data = path.read_bytes()
    assert FEEDS["image"].tobytes() not in data and OUTPUTS["logits"].tobytes() not in data
    record = unpack_record(open_sealed(data, key, source=path.name), source=path.name)
    np.testing.assert_array_equal(record.inputs["image"], FEEDS["image"])
    np.testing.assert_array_equal(record.outputs["logits"], OUTPUTS["logits"])
    assert record.meta["model"] == "digits" and record.meta["release"] == 3 and record.meta["variant"] == "onnx-fp32"
    with pytest.raises(CaptureFileError, match="not to this key"):
        open_sealed(data, other, source=path.name)
    flipped = bytearray(data)
    flipped[-20] ^= 1
    with pytest.raises(CaptureFileError, match="changed or truncated"):
        open_sealed(bytes(flipped), key, source=path.name)


def test_capture_ciphertext_fails_its_gcm_tag_under_another_key() -> None:
    from cryptography.exceptions import InvalidTag

    sealed = seal(b"secret pixels" * 10, X25519PrivateKey.generate().public_key())
    front = len(sealed) - (len(b"secret pixels" * 10) + 16)
    import json

    nonce = bytes.fromhex(json.loads(sealed[12:front])["nonce"])
    with pytest.raises(InvalidTag):
        AESGCM(os.urandom(32)).decrypt(nonce, sealed[front:], sealed[:front])


def test_capture_budget_deletes_the_oldest_files_first(tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()
    one = len(_writer(tmp_path / "probe", key).write(_sample()).read_bytes())  # type: ignore[union-attr]
    writer = _writer(tmp_path, key, max_bytes=3 * one + one // 2)
    written = [writer.write(_sample(at=1000.0 + i)) for i in range(6)]
    assert capture_files(writer.directory) == written[-3:]
    assert writer.counts.evicted == 3 and writer.counts.written == 6


def test_capture_record_larger_than_the_whole_budget_is_skipped(tmp_path: Path) -> None:
    writer = _writer(tmp_path, X25519PrivateKey.generate(), max_bytes=100)
    assert writer.write(_sample()) is None
    assert writer.counts.too_large == 1 and capture_files(writer.directory) == []


def test_capture_retention_deletes_files_older_than_it(tmp_path: Path) -> None:
    writer = _writer(tmp_path, X25519PrivateKey.generate())
    old, new = writer.write(_sample()), writer.write(_sample())
    assert old is not None and new is not None
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert enforce(writer.directory, max_bytes=1 << 20, retention_s=3600.0) == 1
    assert capture_files(writer.directory) == [new]


def test_capture_redaction_keeps_what_the_hook_returns_or_nothing(tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()

    def outputs_only(feeds: Any, outputs: Any) -> Any:
        return {}, outputs

    kept = _writer(tmp_path / "a", key, redact=outputs_only).write(_sample())
    assert kept is not None
    record = unpack_record(open_sealed(kept.read_bytes(), key, source="a"), source="a")
    assert record.inputs == {} and set(record.outputs) == {"logits"}
    dropping = _writer(tmp_path / "b", key, redact=lambda feeds, outputs: None)
    raising = _writer(tmp_path / "c", key, redact=lambda feeds, outputs: 1 / 0)
    assert dropping.write(_sample()) is None and raising.write(_sample()) is None
    assert dropping.counts.redacted_out == 1 and raising.counts.redacted_out == 1
    assert capture_files(dropping.directory) == capture_files(raising.directory) == []


def test_capture_worker_writes_what_the_tap_queued(tmp_path: Path) -> None:
    writer = _writer(tmp_path, X25519PrivateKey.generate()).start()
    for _ in range(3):
        writer.tap("digits", FEEDS, OUTPUTS, "onnx-fp32")
    writer.stop()
    assert writer.counts.written == 3 and len(capture_files(writer.directory)) == 3


def test_capture_refuses_to_start_without_an_operator_key_or_with_a_bad_hook(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="operator_public_key is not set"):
        operator_key(CaptureConfig(rate=0.1))
    with pytest.raises(ConfigError, match="operator_public_key"):
        operator_key(CaptureConfig(rate=0.1, operator_public_key=tmp_path / "missing.pub"))
    with pytest.raises(ConfigError, match="no_such_module_xyz:f"):
        redaction_hook("no_such_module_xyz:f")
    assert redaction_hook("json:dumps") is not None
