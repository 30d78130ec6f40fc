"""Loading a .tflite through our LiteRT backend leaves stderr clean: LiteRT's C++ logger prints
"INFO: Created TensorFlow Lite XNNPACK delegate for CPU." to fd 2 on every load (in ``edgesdk
convert``'s validation and in the agent's log), and edgesdk/runtimes/litert_backend.py takes
that line, and only that line, out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.prebuilt_models import WAKEWORD, extract

pytest.importorskip("ai_edge_litert", reason="the LiteRT backend needs ai-edge-litert (edgesdk[litert])")

CHATTER = "Created TensorFlow Lite XNNPACK delegate"

RAW = """
import sys
import ai_edge_litert.interpreter as m
m.Interpreter(model_content=open(sys.argv[1], "rb").read()).allocate_tensors()
"""

OURS = """
import os, sys
from edgesdk.runtimes.litert_backend import LiteRTBackend
os.write(2, b"before the load\\n")
model = LiteRTBackend().load(open(sys.argv[1], "rb").read())
os.write(2, b"after the load\\n")
print([spec.name for spec in model.inputs])
"""


def _run(script: str, model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True, text=True, timeout=120)


def test_loading_a_tflite_prints_no_litert_chatter(tmp_path: Path) -> None:
    model = extract(WAKEWORD, "okay_nabu.tflite", tmp_path)
    raw = _run(RAW, model)
    assert raw.returncode == 0, raw.stderr
    if CHATTER not in raw.stderr:
        pytest.skip("this LiteRT does not print the XNNPACK line any more: nothing to silence")
    ours = _run(OURS, model)
    assert ours.returncode == 0, ours.stderr
    assert CHATTER not in ours.stderr, ours.stderr
    # fd 2 is back in place and what else was written to it is kept, in order.
    assert ours.stderr.splitlines() == ["before the load", "after the load"], ours.stderr
    assert "input_audio" in ours.stdout


def test_other_lines_written_while_loading_still_reach_stderr() -> None:
    script = (
        "import os\n"
        "from edgesdk.runtimes.litert_backend import _without_chatter\n"
        "with _without_chatter():\n"
        "    os.write(2, b'ERROR: a real problem\\nINFO: Created TensorFlow Lite XNNPACK delegate for CPU.\\nlast\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["ERROR: a real problem", "last"]
