"""Proof that a model goes from an encrypted bundle into each runtime without its plaintext
touching disk.

Per runtime, a fresh Python process with its own HOME, TMPDIR and working directory (and
``strace`` watching every file it opens for writing; without strace that part is a visible skip) verifies the
bundle, decrypts a variant in memory, loads it into the runtime, runs the golden inputs and
checks the predictions — through the install path, the agent's in-process start-up path and
the agent's unseal helper process (``strace -f`` follows it). Then every file in HOME/TMPDIR/cwd and every file the process opened
for writing is scanned for 64-byte windows of the plaintext model files: none may appear.
A positive control (the same probe told to leak the model into a temp file) shows the scan
finds plaintext when it is there.

The bundle comes from the real hand-over: ``edgesdk convert`` (onnx, tflite, openvino for
rpi5-8gb) → ``package_bundle``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import package_bundle
from edgesdk.schemas.report import ConversionReport
from tests.bundle_helpers import convert_digits_with_edgesdk, make_digits_convert_dir, make_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME_VARIANTS = {"onnxruntime": "onnx-fp32", "litert": "tflite-fp32", "openvino": "openvino-fp32"}
WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")


@pytest.fixture(scope="module")
def shipped(digits, request, tmp_path_factory):
    """(bundle, keys, convert dir, note): a bundle of every variant edgesdk convert made."""
    pytest.importorskip("onnxruntime")
    cache = Path(request.config.cache.mkdir("edgesdk-bundle-digits-convert-v1"))
    note = ""
    try:
        convert = convert_digits_with_edgesdk(digits, cache / "out")
    except RuntimeError as exc:  # the converters are another part; onnx-only still proves ORT
        note = str(exc)
        convert = make_digits_convert_dir(digits, tmp_path_factory.mktemp("convert") / "out", int8=False)
    keys = make_keys(tmp_path_factory.mktemp("keys"))
    bundle = package_bundle(
        convert,
        name="digits",
        version="1.0.0",
        release=1,
        publisher_key=keys.publisher_key,
        recipients=[keys.device_pub],
        out=tmp_path_factory.mktemp("bundle") / "digits.edgepkg",
    )
    return bundle, keys, convert, note


def plaintext_windows(convert: Path, variant_id: str) -> list[bytes]:
    """Distinctive 64-byte windows (at 1/4, 1/2, 3/4 of each file, high entropy only)."""
    report = ConversionReport.model_validate_json((convert / "report.json").read_text())
    variant = next(v for v in report.variants if v.id == variant_id)
    windows = []
    for relative in variant.files:
        data = (convert / relative).read_bytes()
        for fraction in (0.25, 0.5, 0.75):
            start = int(len(data) * fraction)
            window = data[start : start + 64]
            if len(window) == 64 and len(set(window)) >= 12:
                windows.append(window)
    assert windows, f"no distinctive window in {variant_id}"
    return windows


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def written_paths(trace: Path) -> set[Path]:
    """Paths the traced process opened with a write flag (strace -e trace=open,openat,openat2,creat)."""
    paths = set()
    for line in trace.read_text(errors="replace").splitlines():
        match = re.search(r'(?:openat2|openat|open|creat)\((?:[^,]+, )?"([^"]+)", ([^)]*)\)', line)
        if match and (WRITE_FLAGS.search(match.group(2)) or "creat(" in line):
            paths.add(Path(match.group(1)))
    return paths


NO_STRACE = (
    "strace is not installed (apt-get install strace; scripts/test installs it): the sandbox scan "
    "passed, but files the probe wrote outside HOME/TMPDIR/cwd were not traced"
)


def run_probe(shipped, variant_id: str, sandbox: Path, *, leak: bool = False) -> tuple[dict, set[Path] | None]:
    """Run the probe; the second value is every path it opened for writing, None without strace."""
    bundle, keys, _, _ = shipped
    home, tmp, cwd = sandbox / "home", sandbox / "tmp", sandbox / "cwd"
    for folder in (home, tmp, cwd):
        folder.mkdir(parents=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [
        sys.executable,
        "-m",
        "tests.bundle_helpers",
        str(bundle),
        str(keys.publisher_pub),
        str(keys.device_key),
        variant_id,
    ]
    command += ["--leak"] if leak else []
    trace = sandbox / "strace.txt"
    strace = shutil.which("strace")
    if strace:
        command = [strace, "-f", "-qq", "-e", "trace=open,openat,openat2,creat", "-o", str(trace), *command]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, (written_paths(trace) if strace else None)


def scan(paths: list[Path], windows: list[bytes]) -> list[str]:
    hits = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        hits += [f"{path} holds plaintext window {i}" for i, w in enumerate(windows) if w in data]
    return hits


@pytest.mark.parametrize("runtime", list(RUNTIME_VARIANTS))
def test_model_loads_from_memory_without_plaintext_on_disk(shipped, tmp_path, runtime: str) -> None:
    from edgesdk.runtimes import available_runtimes

    bundle, _, convert, note = shipped
    variant_id = RUNTIME_VARIANTS[runtime]
    if runtime not in {r.value for r in available_runtimes()}:
        pytest.skip(f"runtime {runtime} is not installed here")
    report = ConversionReport.model_validate_json((convert / "report.json").read_text())
    if variant_id not in {v.id for v in report.variants}:
        pytest.skip(f"no {variant_id} variant to load: {note or 'edgesdk convert did not ship it'}")
    result, written = run_probe(shipped, variant_id, tmp_path)
    assert result["agreement"] == 1.0, result

    windows = plaintext_windows(convert, variant_id)
    sandbox_files = files_under(tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd")
    assert scan(sandbox_files, windows) == []
    if written is None:
        pytest.skip(NO_STRACE)
    # Files written outside the sandbox (a library ignoring TMPDIR, /dev/shm, caches): scan them too.
    # The bundle's source (the convert dir) holds the plaintext by design, on the host.
    outside = [p for p in written if p.exists() and not p.is_relative_to(convert) and p.is_file()]
    assert scan(outside, windows) == []
    deleted = [p for p in written if not p.exists() and not str(p).startswith(("/dev/", "/proc/"))]
    assert deleted == [], f"files written then removed (could have held plaintext): {deleted}"


def test_the_scan_finds_a_leak(shipped, tmp_path) -> None:
    # Positive control: the same probe, told to write the model to a temp file, is caught.
    _, _, convert, _ = shipped
    _, written = run_probe(shipped, "onnx-fp32", tmp_path, leak=True)
    hits = scan(files_under(tmp_path / "tmp"), plaintext_windows(convert, "onnx-fp32"))
    assert hits and all(str(tmp_path / "tmp") in hit for hit in hits)
    if written is None:
        pytest.skip(NO_STRACE)
    # And the trace parser sees the write.
    leaked = [p for p in written if p.suffix == ".bin" and p.is_relative_to(tmp_path / "tmp")]
    assert len(leaked) == 1, sorted(map(str, written))
