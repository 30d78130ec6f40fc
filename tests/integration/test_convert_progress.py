"""Progress of a conversion: ``edgesdk convert`` with stderr piped writes a line per step as it
starts (a live bar there stayed blank for the whole run), and the Python callback counts the
same total from its first call to its last (it went ``[0/4]`` then ``[1/10]``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from edgesdk.cli.output import PROGRESS_LINE
from tests.conftest import assert_one_line_error

# A factory that holds the conversion inside its "reading the model" step until the test lets
# it go, then fails: what the test has read by then was written while the command was running.
GATED_FACTORY = """
import os, time

def held():
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["EDGESDK_TEST_RELEASE"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the factory")
        time.sleep(0.05)
    raise ValueError("released by the test")
"""


def test_piped_convert_shows_each_step_while_it_runs(tmp_path: Path) -> None:
    (tmp_path / "gated_model.py").write_text(GATED_FACTORY)
    release = tmp_path / "release"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "EDGESDK_TEST_RELEASE": str(release)}
    env.pop("EDGESDK_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", "gated_model:held", "--profile", "rpi5-8gb",
         "--out", str(tmp_path / "out"), "--input", "x=1x4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        # The factory waits for `release`, so this line can only come from a stream written as
        # the step starts; one flushed at exit would never arrive (the read would hang, then time out).
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(proc.stderr.readline() if proc.stderr else ""))
        reader.start()
        reader.join(timeout=120)
        assert first and first[0], "no progress line while the conversion was running"
        assert proc.poll() is None, "the command ended before its first progress line was read"
        assert PROGRESS_LINE.match(first[0]) and first[0].rstrip().endswith("[1/5] reading the model"), first[0]
    finally:
        release.touch()
    stdout, rest = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, first[0] + rest)
    assert_one_line_error(done, "gated_model:held", "released by the test")
    assert done.returncode == 1


def test_python_progress_counts_one_total_from_the_first_call(digits, tmp_path: Path) -> None:
    import edgesdk

    calls: list[tuple[str, int, int]] = []
    report = edgesdk.convert(
        str(digits.onnx),
        "rpi5-8gb",
        out=tmp_path / "out",
        calibration=digits.calibration,
        validation=digits.validation,
        formats="onnx",
        precisions=["fp32", "int8"],
        int8_methods=["static-qdq-per-channel"],
        progress=lambda message, done, total: calls.append((message, done, total)),
    )
    assert report.variants
    totals = {total for _, _, total in calls}
    assert len(totals) == 1, calls
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and 0 <= done[0] and done[-1] < calls[0][2], calls
    messages = [m for m, _, _ in calls]
    assert messages[0] == "reading the model" and messages[-1] == "writing the report", messages
    assert "onnx-int8 (static-qdq-per-channel): converting, 2 of 2" in messages, messages
