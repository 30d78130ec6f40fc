"""Provisioning image and enrollment benchmarks, side by side in one run, figures printed (issue 8).

1. What per-device keys cost: bundle size, packaging time and one device's verify + decrypt
   time for 1, 100, 1000 and 3900 approved devices (near the cap: the manifest may be at most
   1 MiB), as ratios to a bundle for one device, and the time of one ``approve`` on a registry
   of that size. Payload: 155 KB (the digits CNN's fp32 size).
2. Provisioning images: ``edgesdk image build`` time and size for an x86-64 profile (this
   machine's platform) and an aarch64 one (rpi5-8gb), and the offline ``install.sh`` time of
   the x86-64 image into a fresh directory. Needs the package index (pip's cache helps);
   ``--skip-images`` leaves it out.

Run: ``.venv/bin/python benchmarks/bench_image.py [--skip-images] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

from edgesdk.bundle import decrypt_variant, package_bundle, verify_bundle  # noqa: E402
from edgesdk.fleet.enrollment import RegistryFile, encode_public_key, recipients_from_registry  # noqa: E402
from edgesdk.keys import key_id, load_publisher_public_key  # noqa: E402
from edgesdk.schemas.enrollment import EnrolledDevice, EnrollmentRegistry  # noqa: E402
from tests.bundle_helpers import make_keys, write_convert_dir  # noqa: E402

# 3900: near the most one bundle can hold (the manifest is capped at 1 MiB, ~3970 slots).
DEVICE_COUNTS = (1, 100, 1000, 3900)
X86_PROFILE = """name: bench-x86
extends: intel-nuc-core-ultra
display_name: x86-64 Debian 12 (benchmark)
platform:
  os: Debian 12 bookworm
  arch: x86_64
  glibc: "2.36"
  python: "{python}"
  wheel_platforms: [{tags}]
"""


def bench_slots(work: Path) -> list[dict[str, Any]]:
    keys = make_keys(work / "keys")
    convert = write_convert_dir(work / "convert", {"onnx-fp32": {"model.onnx": os.urandom(155_000)}})
    trusted = [load_publisher_public_key(keys.publisher_pub)]
    rows = []
    for count in DEVICE_COUNTS:
        registry = RegistryFile(work / f"registry-{count}.json")
        devices = [X25519PrivateKey.generate() for _ in range(count)]
        # Fill the registry in one write; then time one more approval at that size.
        entries = {
            f"dev-{i:05d}": EnrolledDevice(
                device_id=f"dev-{i:05d}",
                public_key=encode_public_key(d.public_key()),
                key_id=key_id(d.public_key()),
                status="approved",
                approved_at=datetime.now(timezone.utc),
            )
            for i, d in enumerate(devices[:-1])
        }
        registry.path.write_text(EnrollmentRegistry(devices=entries).model_dump_json())
        started = time.perf_counter()
        registry.approve(f"dev-{count - 1:05d}", devices[-1].public_key())
        approve_s = time.perf_counter() - started
        started = time.perf_counter()
        bundle = package_bundle(
            convert,
            name="digits",
            version="1.0.0",
            release=1,
            publisher_key=keys.publisher_key,
            recipients=recipients_from_registry(registry.path),
            out=work / f"bundle-{count}.edgepkg",
        )
        package_s = time.perf_counter() - started
        started = time.perf_counter()
        verified = verify_bundle(bundle, trusted_publishers=trusted)
        decrypt_variant(verified, "onnx-fp32", devices[-1])
        open_s = time.perf_counter() - started
        rows.append(
            {
                "devices": count,
                "bundle_kib": bundle.stat().st_size / 1024,
                "package_ms": package_s * 1000,
                "verify_decrypt_ms": open_s * 1000,
                "approve_ms": approve_s * 1000,
            }
        )
    base = rows[0]
    for row in rows:
        row["size_ratio"] = row["bundle_kib"] / base["bundle_kib"]
        row["kib_per_extra_device"] = (
            (row["bundle_kib"] - base["bundle_kib"]) / (row["devices"] - 1) if row["devices"] > 1 else 0.0
        )
    return rows


def _edgesdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True)


def bench_images(work: Path) -> list[dict[str, Any]]:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    tags = ", ".join([f"manylinux_2_{m}_x86_64" for m in range(36, 16, -1)] + ["manylinux2014_x86_64"])
    profiles = work / "profiles"
    profiles.mkdir()
    (profiles / "bench-x86.yaml").write_text(X86_PROFILE.format(python=python, tags=tags))
    rows = []
    for profile, extra in (("bench-x86", ()), ("rpi5-8gb", ()), ("rpi5-8gb", ("--extra", "litert"))):
        out = work / f"{profile}-{len(extra)}.tar.gz"
        started = time.perf_counter()
        proc = _edgesdk(
            "--profiles-dir", str(profiles), "image", "build", "--profile", profile,
            "--broker", "mqtt://127.0.0.1:1883", *extra, "--out", str(out), "--json",
        )  # fmt: skip
        build_s = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"image build failed: {proc.stderr.strip()}")
        manifest = json.loads(proc.stdout)
        row: dict[str, Any] = {
            "profile": profile + (" +litert" if extra else ""),
            "arch": manifest["arch"],
            "wheels": len(manifest["wheels"]),
            "image_mb": out.stat().st_size / 1e6,
            "build_s": build_s,
            "install_s": None,
        }
        if manifest["arch"] == "x86_64":
            unpacked = work / "unpacked"
            with tarfile.open(out) as tar:
                tar.extractall(unpacked, filter="data")
            (top,) = unpacked.iterdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
            env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE="/dev/null")
            started = time.perf_counter()
            proc = subprocess.run(
                ["bash", str(top / "install.sh"), "--root", str(work / "root"), "--python", sys.executable],
                capture_output=True,
                text=True,
                env=env,
            )
            if proc.returncode != 0:
                raise SystemExit(f"install.sh failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            row["install_s"] = time.perf_counter() - started
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-images", action="store_true", help="only the key-slot figures")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        work = Path(tmp)
        (work / "slots").mkdir()
        slots = bench_slots(work / "slots")
        images = [] if args.skip_images else bench_images(work)
    if args.json:
        print(json.dumps({"slots": slots, "images": images}, indent=2))
        return
    print("Per-device keys: bundle for N approved devices (155 KB payload)")
    print(
        f"{'devices':>8} {'bundle KiB':>11} {'x 1 dev':>8} {'KiB/dev':>8} {'package ms':>11} "
        f"{'verify+decrypt ms':>18} {'1 approve ms':>13}"
    )
    for r in slots:
        print(
            f"{r['devices']:>8} {r['bundle_kib']:>11.1f} {r['size_ratio']:>8.2f} {r['kib_per_extra_device']:>8.3f} "
            f"{r['package_ms']:>11.0f} {r['verify_decrypt_ms']:>18.1f} {r['approve_ms']:>13.1f}"
        )
    if images:
        print("\nProvisioning images")
        print(f"{'profile':>18} {'arch':>8} {'wheels':>7} {'image MB':>9} {'build s':>8} {'offline install s':>18}")
        for r in images:
            install = f"{r['install_s']:.1f}" if r["install_s"] is not None else "-"
            print(
                f"{r['profile']:>18} {r['arch']:>8} {r['wheels']:>7} {r['image_mb']:>9.1f} {r['build_s']:>8.1f} {install:>18}"
            )


if __name__ == "__main__":
    main()
