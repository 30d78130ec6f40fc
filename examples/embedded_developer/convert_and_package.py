"""Embedded developer, from Python: convert the digits CNN for a Raspberry Pi 5, package it for
one device, and verify the bundle as that device would — edgesdk.convert / package / verify_bundle.

    python examples/embedded_developer/convert_and_package.py [OUT_DIR]

The digits CNN (8x8 handwritten digits, ~40k parameters) trains in about a minute on a CPU;
set DIGITS_DIR to reuse one already trained (edgesdk.workloads.digits.prepare_digits). ONNX
fp32 + int8 only, so the whole run takes seconds after training. Needs the converter extra:
pip install 'edgesdk[convert]'.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import edgesdk
from edgesdk.keys import generate_device_key, generate_publisher_key
from edgesdk.workloads.digits import prepare_digits

PROFILE = "rpi5-8gb"


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "digits-out")
    out.mkdir(parents=True, exist_ok=True)
    digits = prepare_digits(Path(os.environ.get("DIGITS_DIR") or out / "digits"))

    profile = edgesdk.load_profile(PROFILE)
    print(f"==> 1. convert for {profile.display_name}: ONNX fp32 + int8, each validated in ONNX Runtime")
    shutil.rmtree(out / "convert", ignore_errors=True)  # convert refuses to write into a non-empty dir
    report = edgesdk.convert(
        digits.onnx,
        profile,
        out=out / "convert",
        calibration=digits.calibration,  # .npz keyed by input name: int8 calibration
        validation=digits.validation,  # with "labels": the gate is top-1 agreement
        formats="onnx",
        precisions=["fp32", "int8"],
        name="digits",
        progress=lambda step, done, total: print(f"    [{done}/{total}] {step}"),
    )
    for variant in report.variants:
        accuracy = variant.accuracy.value if variant.accuracy else float("nan")
        print(f"    {variant.id}: {variant.size / 1024:.0f} KiB, {report.metric} {accuracy:.4f} (gate {report.gate:g})")
    for rejected in report.rejected:
        print(f"    rejected {rejected.format.value} {rejected.precision.value}: {rejected.reason}")

    print("==> 2. keys: the publisher's (signs) and the device's (decrypts; a real agent makes its own)")
    keys = out / "keys"
    if not (keys / "publisher" / "publisher.key").exists():  # keys are never overwritten: reuse them
        generate_publisher_key(keys / "publisher")
        generate_device_key(keys / "device")
    publisher_key, publisher_pub = keys / "publisher" / "publisher.key", keys / "publisher" / "publisher.pub"
    device_key, device_pub = keys / "device" / "device.key", keys / "device" / "device.pub"

    print("==> 3. package: one bundle, signed, encrypted to the device's key")
    bundle = edgesdk.package(
        report,  # the report remembers its directory
        version="1.0.0",
        release=1,
        publisher_key=publisher_key,
        recipients=[device_pub],
        expires="365d",
        out=out / "digits-1.0.0.edgepkg",
    )
    print(f"    {bundle} ({bundle.stat().st_size / 1024:.0f} KiB)")

    print("==> 4. verify as the device would: signature, hashes, expiry, target, decryption in memory")
    result = edgesdk.verify_bundle(
        bundle, trusted_publishers=publisher_pub, device_key=device_key, profile=PROFILE, installed_release=0
    )
    print(f"    VERIFIED {result.manifest.model.name} {result.manifest.model.version}: {', '.join(result.checks)}")
    for variant_id, part in result.decrypted.items():
        print(f"    decrypted {variant_id}: {part.files} file(s), {part.size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
