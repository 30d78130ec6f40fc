"""Where the agent's start-up time and memory go, step by step (issues 4 and 5).

1. ``--steps``: each primitive of the start-up path for the digits bundle, timed alone,
   warm (the same step repeated) and cold (an onnxruntime session is built before every
   sample, as it is in the agent between one variant and the next): reading header +
   manifest, the Ed25519 signature, manifest validation, the X25519 key unwrap, AES-GCM of the
   payload, SHA-256 of the plaintext, and the session itself from bytes.
2. ``--memory``: RSS of a fresh process as it takes the agent's steps one by one (imports,
   config, ``Agent()``, loading the installed bundle), with bundles opened in the unseal
   helper (the default: the daemon never imports cryptography) and in process, next to a
   bare process holding the same onnxruntime session; then what ``gc`` + ``malloc_trim`` give back, and the final RSS
   with ``MALLOC_ARENA_MAX=1``.

Run: ``.venv/bin/python benchmarks/bench_start_costs.py [--steps] [--memory]`` (both by default).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def steps(work: Path, samples: int = 100) -> None:
    import hashlib

    from edgesdk.offline import disable_vendor_telemetry

    disable_vendor_telemetry()
    import onnxruntime as ort

    from edgesdk.bundle import package_bundle, verify_bundle
    from edgesdk.bundle.container import signed_message
    from edgesdk.bundle.decrypt import _decrypt_parts
    from edgesdk.bundle.key_slots import unwrap_content_key
    from edgesdk.bundle.reader import open_bundle_file, read_front
    from edgesdk.schemas.manifest import BundleManifest
    from edgesdk.workloads.digits import prepare_digits
    from tests.bundle_helpers import make_digits_convert_dir, make_keys

    digits = prepare_digits(ROOT / ".pytest_cache" / "d" / "edgesdk-digits-v1")
    convert = make_digits_convert_dir(digits, work / "convert", int8=False)
    keys = make_keys(work / "keys")
    bundle = package_bundle(convert, name="digits", version="1.0.0", release=1, publisher_key=keys.publisher_key,
                            recipients=[keys.device_pub], out=work / "digits.edgepkg")  # fmt: skip
    publisher, device = keys.trusted(), keys.device()
    verified = verify_bundle(bundle, trusted_publishers=[publisher])
    variant = verified.manifest.variant("onnx-fp32")
    with open_bundle_file(bundle) as handle:
        front = read_front(handle, source="bench")
    message = signed_message(front.header.raw, front.manifest_bytes)
    plaintext = (convert / "artifacts" / "onnx-fp32" / "model.onnx").read_bytes()
    encryption = verified.manifest.encryption
    options = ort.SessionOptions()

    def session() -> Any:
        return ort.InferenceSession(plaintext, sess_options=options, providers=["CPUExecutionProvider"])

    def read() -> None:
        with open_bundle_file(bundle) as handle:
            read_front(handle, source="bench")

    rows: dict[str, Callable[[], Any]] = {
        "read header + manifest": read,
        "Ed25519 signature": lambda: publisher.verify(front.signature, message),
        "manifest validation": lambda: BundleManifest.parse_json_clear(front.manifest_bytes, source="bench"),
        "X25519 unwrap + HKDF": lambda: unwrap_content_key(encryption.key_slots, device),
        "unwrap + AES-GCM of the payload": lambda: _decrypt_parts(
            verified, variant.payload, [variant.size], device, check_plaintext=False
        ),
        "SHA-256 of the plaintext": lambda: hashlib.sha256(plaintext).digest(),
        "session from bytes": session,
    }
    print(f"== steps of the start-up path, digits ({len(plaintext) / 1e6:.3f} MB), median of {samples} (µs)")
    print(f"  {'step':<34} {'warm':>8} {'cold':>8}")
    for name, fn in rows.items():
        warm, cold = [], []
        for _ in range(samples):
            start = time.perf_counter()
            fn()
            warm.append(time.perf_counter() - start)
        for _ in range(samples):
            session()  # evicts the caches the way the agent's own session builds do
            start = time.perf_counter()
            fn()
            cold.append(time.perf_counter() - start)
        print(f"  {name:<34} {statistics.median(warm) * 1e6:8.1f} {statistics.median(cold) * 1e6:8.1f}")


_MEMORY_PROBE = r"""
import gc, ctypes, sys
from pathlib import Path
import psutil
P = psutil.Process()
rows = [("python + psutil", P.memory_info().rss)]
def step(name):
    rows.append((name, P.memory_info().rss))
from edgesdk.offline import disable_vendor_telemetry
disable_vendor_telemetry()
import numpy, onnxruntime; step("numpy + onnxruntime")
import hashlib; hashlib.sha256(b""); step("hashlib (libcrypto)")
import asyncio; step("asyncio (+ ssl)")
import click; step("click")
import pydantic; from pydantic import BaseModel; step("pydantic")
if sys.argv[2] == "in_process":
    import cryptography.hazmat.primitives.asymmetric.ed25519, cryptography.hazmat.primitives.asymmetric.x25519
    import cryptography.hazmat.primitives.ciphers.aead, cryptography.hazmat.primitives.kdf.hkdf
    import cryptography.hazmat.primitives.serialization; step("cryptography")
import edgesdk.agent.cli, edgesdk.agent.daemon; step("agent modules (daemon, API, schemas)")
from edgesdk.agent.config import load_config
from edgesdk.agent.daemon import Agent
config = load_config(Path(sys.argv[1])).model_copy(update={"unseal": sys.argv[2]}); step("config")
agent = Agent(config); step("Agent(): profile, keys, store")
agent.load_installed(); step(f"load the bundle (fp32 + int8 sessions; unseal {sys.argv[2]})")
gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0); step("after gc + malloc_trim")
previous = 0
for name, rss in rows:
    print(f"{name}\t{rss / 2**20:.1f}\t{(rss - previous) / 2**20:.1f}")
    previous = rss
"""

_BARE_PROBE = r"""
import sys, numpy as np, onnxruntime as ort, psutil
P = psutil.Process()
before = P.memory_info().rss
session = ort.InferenceSession(open(sys.argv[1], "rb").read(), providers=["CPUExecutionProvider"])
x = np.zeros((1, 1, 8, 8), np.float32)
for _ in range(200):
    session.run(None, {"image": x})
print(f"{P.memory_info().rss / 2**20:.1f}\t{(P.memory_info().rss - before) / 2**20:.1f}")
"""


def memory(work: Path) -> None:
    import os

    from bench_agent import prepare

    setup = prepare(work)
    config = str(setup["device"].config)
    env = dict(os.environ)
    for mode in ("helper", "in_process"):
        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, config, mode], capture_output=True, text=True,
                             check=True, env=env, cwd=ROOT).stdout  # fmt: skip
        print(f"== RSS of a fresh process taking the agent's start-up steps (MB; digits bundle; unseal {mode})")
        print(f"  {'step':<52} {'RSS':>7} {'added':>7}")
        for line in out.strip().splitlines():
            name, rss, added = line.split("\t")
            print(f"  {name:<52} {float(rss):7.1f} {float(added):7.1f}")
    arena = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, config, "helper"], capture_output=True, text=True,
                           check=True, env={**env, "MALLOC_ARENA_MAX": "1"}, cwd=ROOT).stdout  # fmt: skip
    print(
        f"  final RSS with MALLOC_ARENA_MAX=1 (unseal helper): {float(arena.strip().splitlines()[-1].split(chr(9))[1]):.1f}"
    )
    bare = subprocess.run([sys.executable, "-c", _BARE_PROBE, str(setup["digits"].onnx)], capture_output=True,
                          text=True, check=True, env=env).stdout.split("\t")  # fmt: skip
    print(f"  bare process (numpy + onnxruntime + psutil + the fp32 session, 200 runs): {float(bare[0]):.1f} MB, "
          f"of which the session and its runs {float(bare[1]):.1f} MB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    both = not (args.steps or args.memory)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        if args.steps or both:
            steps(Path(tmp) / "steps")
        if args.memory or both:
            memory(Path(tmp) / "memory")


if __name__ == "__main__":
    main()
