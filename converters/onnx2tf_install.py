"""``python -m edgesdk.converters.onnx2tf_install [VENV_DIR]``: create the onnx2tf toolchain venv.

The venv goes to ``VENV_DIR``, else where :func:`edgesdk.converters.onnx2tf_route.venv_dir`
looks (``EDGESDK_ONNX2TF`` or ``~/.cache/edgesdk/toolchains/onnx2tf``). About 2.6 GB and a few
minutes: TensorFlow is most of it. A failure is one ``error:`` line and exit 1.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from edgesdk.converters.onnx2tf_route import venv_dir

from edgesdk.errors import ConversionError

#: onnx2tf 1.29.24 pins what it needs (TensorFlow 2.19.0, onnx 1.19.1, onnxruntime 1.23.0,
#: onnxsim 0.4.36, numpy 1.26.4); checked with ``pip install --dry-run`` on Python 3.11.
PIP_REQUIREMENTS = ("onnx2tf==1.29.24",)


def _run(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise ConversionError(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")


def install(target: Path, python: str = sys.executable) -> Path:
    """Create the venv at ``target`` and pip-install onnx2tf into it; the onnx2tf executable."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-m", "venv", str(target)], f"creating a venv in {target}")
    _run([str(target / "bin" / "python"), "-m", "pip", "install", *PIP_REQUIREMENTS], "pip install onnx2tf")
    exe = target / "bin" / "onnx2tf"
    if not exe.is_file():
        raise ConversionError(f"pip finished but {exe} does not exist")
    return exe


def main(argv: Sequence[str] | None = None) -> int:
    """Install into ``argv[0]`` or the default place; prints where, or one error line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m edgesdk.converters.onnx2tf_install [VENV_DIR]", file=sys.stderr)
        return 2
    target = Path(args[0]).expanduser() if args else venv_dir()
    print(f"installing onnx2tf into {target} (≈2.6 GB, a few minutes)", flush=True)
    try:
        exe = install(target)
    except (ConversionError, OSError) as exc:
        print(f"error: installing the onnx2tf toolchain failed: {exc}", file=sys.stderr)
        return 1
    print(f"onnx2tf toolchain ready: {exe}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
