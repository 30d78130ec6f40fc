"""One intra-op thread for tiny models (edgesdk/runtimes/ort_threads.py): the choice follows
what was measured, and anything that cannot be measured keeps onnxruntime's default."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from edgesdk.runtimes import ort_threads


class FakeSession:
    """What ``choose`` reads of an InferenceSession; each run takes ``seconds`` (slept)."""

    def __init__(self, seconds: float, *, input_type: str = "tensor(float)", fails: bool = False) -> None:
        self.seconds = seconds
        self.fails = fails
        self.input_type = input_type
        self.runs = 0

    def get_inputs(self) -> list[Any]:
        return [SimpleNamespace(name="x", type=self.input_type, shape=["batch", 4])]

    def get_outputs(self) -> list[Any]:
        return [SimpleNamespace(name="y")]

    def run(self, names: list[str], feeds: dict[str, Any], options: Any) -> list[Any]:
        assert names == ["y"] and feeds["x"].shape == (1, 4)  # a symbolic dimension becomes 1
        self.runs += 1
        if self.fails:
            raise RuntimeError("shape mismatch")
        if self.seconds:
            time.sleep(self.seconds)
        return [feeds["x"]]


def _choose(default: FakeSession, single: FakeSession | None) -> tuple[Any, str, list[FakeSession]]:
    made: list[FakeSession] = []

    def one_thread() -> FakeSession:
        assert single is not None, "a large model must not be loaded a second time"
        made.append(single)
        return single

    chosen, why = ort_threads.choose(default, default.run, one_thread)
    return chosen, why, made


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_threads.os, "cpu_count", lambda: 2)


def test_a_tiny_model_that_runs_faster_on_one_thread_gets_one() -> None:
    default, single = FakeSession(0.0015), FakeSession(0.0)
    chosen, why, _ = _choose(default, single)
    assert chosen is single
    assert why.startswith("1 (") and "µs per run with one thread" in why


def test_a_tiny_model_that_is_not_faster_on_one_thread_keeps_the_default() -> None:
    default, single = FakeSession(0.0), FakeSession(0.0015)
    chosen, why, made = _choose(default, single)
    assert chosen is default and made == [single]
    assert why.startswith("onnxruntime default (")


def test_a_large_model_is_run_once_and_never_loaded_again() -> None:
    default = FakeSession(25 * ort_threads.TINY_RUN_S + 0.01)
    chosen, why, made = _choose(default, None)
    assert chosen is default and made == [] and default.runs == 1
    assert "large enough to share" in why


@pytest.mark.parametrize(
    ("session", "reason"),
    [
        (FakeSession(0.0, input_type="seq(tensor(float))"), "inputs zeros cannot stand in for"),
        (FakeSession(0.0, fails=True), "did not run on zeros"),
    ],
)
def test_what_cannot_be_timed_keeps_the_default(session: FakeSession, reason: str) -> None:
    chosen, why, made = _choose(session, None)
    assert chosen is session and made == []
    assert reason in why


def test_one_core_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_threads, "usable_cpus", lambda: 1)
    session = FakeSession(0.0)
    chosen, why, _ = _choose(session, None)
    assert chosen is session and session.runs == 0 and "one core" in why


def test_onnxruntime_auto_threads_report_what_the_session_got() -> None:
    pytest.importorskip("onnxruntime")
    from edgesdk.runtimes import load_model
    from tests.unit.test_runtime_settings import _tiny_onnx

    loaded = load_model("onnxruntime", _tiny_onnx(), options={"intra_op_num_threads": "auto"})
    threads = loaded._session.get_session_options().intra_op_num_threads  # type: ignore[attr-defined]
    # Which one wins is this machine's measurement; the report must say the one the session has.
    assert loaded.threads.startswith("1 (") == (threads == 1), (loaded.threads, threads)  # type: ignore[attr-defined]
    assert "per run" in loaded.threads  # type: ignore[attr-defined]
    import numpy as np

    assert loaded.run({"x": np.array([[-1, 2, -3, 4]], np.float32)})["y"].tolist() == [[0, 2, 0, 4]]


@pytest.mark.parametrize(
    "threads, cpus, free",
    [(None, 2, False), ("2", 2, False), ("1", 2, True), ("1", 1, False), ("3", 4, True), ("4", 4, False)],
    ids=["default", "every-core", "one-of-two", "one-of-one", "three-of-four", "four-of-four"],
)
def test_onnxruntime_says_whether_a_run_leaves_a_core_free(
    monkeypatch: pytest.MonkeyPatch, threads: str | None, cpus: int, free: bool
) -> None:
    """The agent NaN/Inf-scans large inputs beside the run only where a core is idle meanwhile:
    onnxruntime's default threads take every core, so only fewer threads than cores leave one."""
    pytest.importorskip("onnxruntime")
    from edgesdk.runtimes import load_model
    from tests.unit.test_runtime_settings import _tiny_onnx

    monkeypatch.setattr(ort_threads, "usable_cpus", lambda: cpus)
    options = {"intra_op_num_threads": threads} if threads else {}
    loaded = load_model("onnxruntime", _tiny_onnx(), options=options)
    assert loaded.cores_free_while_running is free


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_usable_cpus_are_the_affinity_not_the_machine() -> None:
    """A process held to one CPU (a container's cpuset, taskset) has one core to spare, not
    os.cpu_count()'s: checked in a child process pinned to one CPU."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from edgesdk.runtimes.ort_threads import usable_cpus; print(usable_cpus())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "1"
