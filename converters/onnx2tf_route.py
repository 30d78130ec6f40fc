"""ONNX → fp32 .tflite through onnx2tf, run as a subprocess from its own virtual environment.

onnx2tf pins old numpy/onnx/onnxruntime/TensorFlow, so it cannot share edgesdk's environment
(see TOOLCHAIN_NOTES.md). It lives in a venv of its own: ``EDGESDK_ONNX2TF`` (that venv or its
``onnx2tf`` executable), else ``~/.cache/edgesdk/toolchains/onnx2tf``; ``python -m
edgesdk.converters.onnx2tf_install`` creates it.

Pitfalls handled here: onnx2tf rewrites its input in place (onnxsim), so it gets a temporary
copy; it needs its venv's ``bin`` on PATH (else it logs ``FileNotFoundError: 'onnxsim'`` and
still exits 0), so the output file is checked; inputs of rank ≥ 3 stay NCHW (``-k``) so the
signature matches the ONNX model; every input shape is fixed to the example (batch 1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError, UnsupportedOpError
from edgesdk.schemas.manifest import TensorSpec

ENV_VAR = "EDGESDK_ONNX2TF"
DEFAULT_VENV = Path("~/.cache/edgesdk/toolchains/onnx2tf")
INSTALL_HINT = f"run `python -m edgesdk.converters.onnx2tf_install` (a ≈2.6 GB venv) or set {ENV_VAR}"
TIMEOUT_S = 900
_LOG_TAIL_LINES = 12


def venv_dir() -> Path:
    """Where the onnx2tf venv is (or would be installed)."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = Path(configured).expanduser()
        return path.parent.parent if path.is_file() else path
    return DEFAULT_VENV.expanduser()


def find_onnx2tf() -> Path | None:
    """The onnx2tf executable of the toolchain venv, or None when it is not installed."""
    configured = os.environ.get(ENV_VAR)
    if configured and Path(configured).expanduser().is_file():
        return Path(configured).expanduser()
    exe = venv_dir() / "bin" / "onnx2tf"
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def missing_reason() -> str | None:
    """None when the route can run; otherwise the one-line reason, with how to install it."""
    if find_onnx2tf() is not None:
        return None
    return f"the ONNX→TFLite route needs the onnx2tf toolchain in {venv_dir()}: {INSTALL_HINT}"


def command_line(
    exe: Path, onnx_path: Path, out_dir: Path, inputs: Sequence[TensorSpec], example: Mapping[str, np.ndarray]
) -> list[str]:
    """The onnx2tf invocation: shapes fixed to the example, NCHW kept for rank ≥ 3 inputs."""
    command = [str(exe), "-i", str(onnx_path), "-o", str(out_dir)]
    # Erf (GELU) would otherwise become a Select-TF op (FlexErf) that LiteRT's builtin
    # interpreter cannot load; onnx2tf's pseudo op writes it with builtin ops.
    command += ["-rtpo", "Erf"]
    keep_layout = [s.name for s in inputs if len(np.shape(example[s.name])) >= 3]
    if keep_layout:
        command += ["-k", *keep_layout]
    command += ["-ois", *(f"{s.name}:{','.join(str(d) for d in np.shape(example[s.name]))}" for s in inputs)]
    return command


def _log_tail(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return " | ".join((errors or lines)[-_LOG_TAIL_LINES // 3 :])[-600:]


def convert_onnx(
    onnx_path: Path,
    inputs: Sequence[TensorSpec],
    example: Mapping[str, np.ndarray],
    *,
    where: str,
    timeout_s: float = TIMEOUT_S,
) -> bytes:
    """Run onnx2tf on a temporary copy of ``onnx_path``; the fp32 .tflite bytes, or ConversionError."""
    exe = find_onnx2tf()
    if exe is None:
        raise ConversionError(f"onnx2tf toolchain not installed: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="edgesdk-onnx2tf-") as tmp:
        work = Path(tmp)
        copy = work / "model.onnx"  # onnx2tf rewrites its input in place
        shutil.copyfile(onnx_path, copy)
        out_dir = work / "out"
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(exe.parent), env.get("PATH", "")])  # onnxsim & co. live there
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONNOUSERSITE"] = "1"
        try:
            proc = subprocess.run(
                command_line(exe, copy, out_dir, inputs, example),
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"onnx2tf on {where} ran past {timeout_s:.0f} s") from exc
        log = (proc.stdout or "") + (proc.stderr or "")
        if os.environ.get("EDGESDK_DEBUG"):
            sys.stderr.write(log)
        produced = out_dir / "model_float32.tflite"
        if proc.returncode != 0 or not produced.is_file():
            tail = _log_tail(log)
            status = f"exit {proc.returncode}" if proc.returncode else "no model_float32.tflite written"
            # onnx2tf runs as a separate process: its log is the only thing it tells us.
            if "not supported" in log.lower() or "unsupported" in log.lower():
                raise UnsupportedOpError(f"onnx2tf cannot express an op of {where} ({status}): {tail}")
            raise ConversionError(f"onnx2tf failed on {where} ({status}): {tail}")
        return produced.read_bytes()
