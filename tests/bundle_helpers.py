"""Building convert output dirs, keys and bundles for the bundle tests.

Two kinds of convert dir, both in the layout ``edgesdk convert`` writes (see
edgesdk/schemas/report.py): ``write_convert_dir`` with arbitrary file contents (unit tests:
the packager does not look inside models), and ``make_digits_convert_dir`` with the real
digits CNN as ONNX fp32 plus an onnxruntime static-QDQ int8 variant, a golden set and
accuracy results measured in onnxruntime (integration tests, benchmarks).
"""

from __future__ import annotations

import fcntl
import io
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.keys import (
    generate_device_key,
    generate_publisher_key,
    load_device_private_key,
    load_publisher_private_key,
    load_publisher_public_key,
)
from edgesdk.schemas.manifest import AccuracyResult, TensorSpec
from edgesdk.schemas.report import ConversionReport, ShippedVariant

DIGITS_INPUTS = [TensorSpec(name="image", dtype="float32", shape=["batch", 1, 8, 8])]
DIGITS_OUTPUTS = [TensorSpec(name="logits", dtype="float32", shape=["batch", 10])]


@dataclass(frozen=True)
class KeySet:
    """A publisher key pair and a device key pair on disk, plus the loaded keys."""

    directory: Path
    publisher_key: Path
    publisher_pub: Path
    device_key: Path
    device_pub: Path

    def signer(self) -> Any:
        return load_publisher_private_key(self.publisher_key)

    def trusted(self) -> Any:
        return load_publisher_public_key(self.publisher_pub)

    def device(self) -> Any:
        return load_device_private_key(self.device_key)


def make_keys(directory: Path) -> KeySet:
    publisher_key, publisher_pub = generate_publisher_key(directory / "publisher")
    device_key, device_pub = generate_device_key(directory / "device")
    return KeySet(directory, publisher_key, publisher_pub, device_key, device_pub)


def write_convert_dir(
    out: Path,
    variants: dict[str, dict[str, bytes]],
    *,
    profile: str = "rpi5-8gb",
    golden: dict[str, np.ndarray] | None = None,
    runtime: str = "onnxruntime",
    fmt: str = "onnx",
) -> Path:
    """A convert output dir whose variants hold the given files (variant id → name → bytes)."""
    out.mkdir(parents=True, exist_ok=True)
    shipped = []
    for variant_id, files in variants.items():
        base = out / "artifacts" / variant_id
        relative = []
        for name, content in files.items():
            path = base / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            relative.append(path.relative_to(out).as_posix())
        precision = "int8" if "int8" in variant_id else "fp32"
        shipped.append(
            ShippedVariant(
                id=variant_id,
                format=fmt,  # type: ignore[arg-type]
                precision=precision,  # type: ignore[arg-type]
                runtime=runtime,  # type: ignore[arg-type]
                files=relative,
                size=sum(len(c) for c in files.values()),
                inputs=DIGITS_INPUTS,
                outputs=DIGITS_OUTPUTS,
            )
        )
    golden_name = None
    if golden is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **golden)  # type: ignore[arg-type]
        (out / "golden.npz").write_bytes(buffer.getvalue())
        golden_name = "golden.npz"
    report = ConversionReport(
        model_name="digits",
        source="tests",
        profile=profile,
        created=datetime.now(timezone.utc),
        metric="top1",
        gate=0.98,
        variants=shipped,
        golden=golden_name,
    )
    (out / "report.json").write_text(report.model_dump_json(indent=2))
    return out


def placeholder_bundle(root: Path, keys: KeySet) -> Path:
    """A signed, encrypted digits 1.0.0 bundle whose model is random bytes, for tests of a service
    that stores and offers bundles but never runs their model."""
    import os

    from edgesdk.bundle import package_bundle

    convert = write_convert_dir(root / "convert", {"onnx-fp32": {"model.onnx": os.urandom(2048)}})
    return package_bundle(
        convert,
        name="digits",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        out=root / "digits.edgepkg",
    )


def _quantize_int8(fp32: Path, out: Path, calibration: np.ndarray) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter([{"image": calibration[i : i + 1]} for i in range(len(calibration))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    quantize_static(
        str(fp32),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )


@contextmanager
def one_builder(out: Path) -> Iterator[None]:
    """One builder of the cached folder ``out`` at a time: the suite's test processes (pytest-xdist)
    and the arm64 lane share the cache, and two building one folder at once removed each other's
    files (final8: 30 errors 'model.onnx ... File doesn't exist'). The others wait, then find it
    whole. The lock is a sibling file, so removing a half-built folder never removes a held lock."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_name(out.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def make_digits_convert_dir(digits: Any, out: Path, *, profile: str = "rpi5-8gb", int8: bool = True) -> Path:
    """A real convert dir for the digits CNN: onnx-fp32 (+ onnx-int8), golden.npz, report.json.

    Accuracy is measured in onnxruntime as top-1 agreement with the fp32 model."""
    with one_builder(out):
        return _make_digits_convert_dir(digits, out, profile=profile, int8=int8)


def _make_digits_convert_dir(digits: Any, out: Path, *, profile: str, int8: bool) -> Path:
    import onnxruntime as ort

    if (out / "report.json").exists():
        return out
    work = out.with_name(out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    (work / "artifacts" / "onnx-fp32").mkdir(parents=True)
    fp32 = work / "artifacts" / "onnx-fp32" / "model.onnx"
    shutil.copyfile(digits.onnx, fp32)
    validation = np.load(digits.validation)
    images, labels = validation["image"], validation["labels"]

    def run(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(["logits"], {"image": images})[0]

    reference = run(fp32)
    variants = [("onnx-fp32", "fp32", fp32, None)]
    if int8:
        (work / "artifacts" / "onnx-int8").mkdir(parents=True)
        q = work / "artifacts" / "onnx-int8" / "model.onnx"
        _quantize_int8(fp32, q, np.load(digits.calibration)["image"][:64])
        variants.append(("onnx-int8", "int8", q, "static-qdq-per-channel"))
    shipped = []
    for variant_id, precision, path, method in variants:
        logits = run(path)
        agreement = float((logits.argmax(1) == reference.argmax(1)).mean())
        shipped.append(
            ShippedVariant(
                id=variant_id,
                format="onnx",  # type: ignore[arg-type]
                precision=precision,  # type: ignore[arg-type]
                runtime="onnxruntime",  # type: ignore[arg-type]
                files=[path.relative_to(work).as_posix()],
                size=path.stat().st_size,
                inputs=DIGITS_INPUTS,
                outputs=DIGITS_OUTPUTS,
                accuracy=AccuracyResult(
                    metric="top1",
                    value=agreement,
                    gate=0.98,
                    passed=agreement >= 0.98,
                    samples=len(images),
                    note=f"label accuracy {(logits.argmax(1) == labels).mean():.4f}",
                ),
                quantization_method=method,
            )
        )
    np.savez(work / "golden.npz", image=images[:16], **{"output:logits": reference[:16]})  # type: ignore[arg-type]
    report = ConversionReport(
        model_name="digits",
        source=str(digits.onnx),
        profile=profile,
        created=datetime.now(timezone.utc),
        metric="top1",
        gate=0.98,
        variants=shipped,
    )
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return out


def craft_bundle(
    path: Path,
    manifest: bytes,
    payload_area: bytes,
    signer: Any,
    *,
    publisher_key_id: bytes | None = None,
    manifest_length: int | None = None,
    payload_area_length: int | None = None,
    version: int = 1,
) -> Path:
    """Write a container byte by byte, signed by ``signer``, with any header values: for
    attacks that only a (compromised or buggy) trusted packager could produce."""
    from edgesdk.bundle.container import HEADER, MAGIC, signed_message
    from edgesdk.keys import key_id_bytes

    header = HEADER.pack(
        MAGIC,
        version,
        0,
        len(manifest) if manifest_length is None else manifest_length,
        publisher_key_id if publisher_key_id is not None else key_id_bytes(signer.public_key()),
        len(payload_area) if payload_area_length is None else payload_area_length,
        bytes(8),
    )
    signature = signer.sign(signed_message(header, manifest))
    path.write_bytes(header + manifest + signature + payload_area)
    return path


def split_bundle(path: Path) -> tuple[dict[str, Any], bytes]:
    """The manifest (as a dict) and the payload area of a bundle file."""
    import json

    from edgesdk.bundle.container import HEADER_SIZE, SIGNATURE_SIZE, parse_header

    data = path.read_bytes()
    header = parse_header(data[:HEADER_SIZE], source=str(path))
    manifest = json.loads(data[HEADER_SIZE : HEADER_SIZE + header.manifest_length])
    return manifest, data[HEADER_SIZE + header.manifest_length + SIGNATURE_SIZE :]


def resign_bundle(source: Path, out: Path, signer: Any, mutate: Any, *, payload_area: bytes | None = None) -> Path:
    """Copy ``source`` with its manifest changed by ``mutate(manifest_dict)`` and signed again."""
    import json

    manifest, payloads = split_bundle(source)
    mutate(manifest)
    return craft_bundle(out, json.dumps(manifest).encode(), payloads if payload_area is None else payload_area, signer)


def trained_digits_cnn() -> Any:
    """``module:factory`` for ``edgesdk convert``: the trained digits CNN (state dict path in
    the DIGITS_STATE environment variable), so the convert can reach TFLite via PyTorch."""
    import os

    import torch

    from edgesdk.workloads.digits import build_digits_cnn

    model = build_digits_cnn()
    model.load_state_dict(torch.load(os.environ["DIGITS_STATE"], weights_only=True))
    return model.eval()


def convert_digits_with_edgesdk(digits: Any, out: Path, *, precisions: str = "fp32", timeout: float = 600) -> Path:
    """Run the real ``edgesdk convert`` (engineer A's pipeline) on the trained digits CNN for
    rpi5-8gb (onnx, tflite, openvino). Returns ``out``; raises RuntimeError with the CLI's
    error line if the convert fails. Reuses ``out`` when a previous run completed."""
    with one_builder(out):
        return _convert_digits_with_edgesdk(digits, out, precisions=precisions, timeout=timeout)


def _convert_digits_with_edgesdk(digits: Any, out: Path, *, precisions: str, timeout: float) -> Path:
    import os
    import subprocess
    import sys

    if (out / "report.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    repo_root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, DIGITS_STATE=str(digits.state_dict), PYTHONPATH=str(repo_root))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk.cli.main",
            "convert",
            "tests.bundle_helpers:trained_digits_cnn",
            "--profile",
            "rpi5-8gb",
            "--out",
            str(out),
            "--name",
            "digits",
            "--calibration",
            str(digits.calibration),
            "--validation",
            str(digits.validation),
            "--precisions",
            precisions,
            "--input",
            "image=1x1x8x8",
            "--output-names",
            "logits",
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=timeout,
    )
    if proc.returncode != 0 or not (out / "report.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        raise RuntimeError(f"edgesdk convert failed: {proc.stderr.strip()[-500:]}")
    return out


def in_memory_probe(argv: list[str] | None = None) -> None:
    """Subprocess entry of the in-memory loading proof: verify, decrypt, load, infer, print JSON
    (through the install path, the agent's in-process start-up path and its unseal helper).

    ``argv``: bundle, publisher .pub, device .key, variant id, and optionally ``--leak`` (the
    positive control: also write the plaintext to a temp file, which the scan must find)."""
    import json
    import sys
    import tempfile

    from edgesdk.offline import disable_vendor_telemetry

    disable_vendor_telemetry()  # as the agent does before importing any runtime
    from edgesdk.bundle import decrypt_and_load, decrypt_golden, decrypt_variant, verify_bundle, verify_installed_bundle
    from edgesdk.runtimes import load_variant

    args = list(sys.argv[1:] if argv is None else argv)
    bundle_path, publisher_pub, device_key_path, variant_id = args[:4]
    verified = verify_bundle(bundle_path, trusted_publishers=[publisher_pub], profile="rpi5-8gb")
    device_key = load_device_private_key(device_key_path)
    files = decrypt_variant(verified, variant_id, device_key)
    golden = decrypt_golden(verified, device_key)
    if golden is None:
        raise SystemExit("bundle has no golden set")
    variant = verified.manifest.variant(variant_id)
    images = golden["image"]

    def agreement_of(model: Any) -> float:
        if isinstance(model.inputs[0].shape[0], int):  # fixed batch
            logits = np.concatenate([model.run({"image": images[i : i + 1]})["logits"] for i in range(len(images))])
        else:
            logits = model.run({"image": images})["logits"]
        return float((logits.argmax(1) == golden["output:logits"].argmax(1)).mean())

    # The install path (every hash first), then the agent's start-up path for the same bundle.
    agreement = agreement_of(load_variant(variant.runtime.value, files))
    reopened = verify_installed_bundle(
        bundle_path,
        trusted_publishers=[publisher_pub],
        profile="rpi5-8gb",
        installed_front_sha256=verified.front_sha256,
        installed_sha256=verified.sha256,
    )
    started = decrypt_and_load(reopened, variant_id, device_key, lambda f: load_variant(variant.runtime.value, f))
    agreement = min(agreement, agreement_of(started))
    # And the daemon's default: the unseal helper process (traced too: strace -f follows it).
    from edgesdk.agent.unseal import Unsealer

    with Unsealer(publisher_keys=[Path(publisher_pub)], device_key=Path(device_key_path)) as unsealer:
        opened = unsealer.verify_installed(
            Path(bundle_path),
            installed_front_sha256=verified.front_sha256,
            installed_sha256=verified.sha256,
            profile="rpi5-8gb",
        )
        helped = load_variant(variant.runtime.value, unsealer.decrypt(opened, variant_id))
    agreement = min(agreement, agreement_of(helped))
    if "--leak" in args:
        with tempfile.NamedTemporaryFile(delete=False, suffix=".bin") as leak:
            leak.write(next(iter(files.values())))
    print(json.dumps({"variant": variant_id, "runtime": variant.runtime.value, "agreement": agreement}))


if __name__ == "__main__":
    in_memory_probe()
