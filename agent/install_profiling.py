"""Profiling at install: once a model is proven here, time its variants in the background.

When: at the **end of probation** (the update's ``COMMITTED``), not while it runs. Probation
judges the new model on this device's real traffic (error rate, p95 latency SLO, drift):
profiling beside it would take the CPU and memory that evidence is measured with, and could
fail a good update (or pass a slow one). Memory too: during probation the previous model stays
loaded beside the new one, which is what the unit's ``MemoryMax`` is sized for
(edgesdk/image/unit_limits.py); after the commit the child's one variant at a time fits where the
previous model was. A model that is rolled back is not worth timing either.
The same happens when the daemon serves a committed model this device never measured (a
sideload with ``edge-agent install``, an agent upgraded from one without profiling, a profiling
run that a restart cut short).

How: in a **child process** (``python -m edgesdk.agent.install_profiling``, the agent's config on
its stdin) at a low priority (``profiling.nice``). Serving is never blocked: the daemon's model
keeps answering while the child decrypts and times its own copy of each variant; the resident
sizes it records are those of a clean process, not of one already holding the served model; and
with ``unseal = "helper"`` the daemon still never loads the device key. The child writes
``DATA_DIR/measurements.json``; the daemon then reports the figures (``/v1/status``, telemetry,
a ``profiled`` event) and, when the measured ladder drops a step it loaded, reloads the model so
the governor steps by what was measured.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.schemas.agent_config import AgentConfig, ProfilingConfig
from edgesdk.schemas.measurements import DeviceMeasurements

log = logging.getLogger("edgesdk.agent.install_profiling")

#: What a profiling run is keyed by: the model and its release.
ModelKey = tuple[str, int]


def child_command() -> list[str]:
    return [sys.executable, "-m", "edgesdk.agent.install_profiling"]


class InstallProfiler:
    """Starts one profiling child at a time for the committed model, and reports what it measured.

    ``serving`` -> (model, release) serving now or None; ``committed`` -> the store's answer;
    ``measured`` -> the saved figures; ``on_measured`` is called (in the profiler's thread) with
    the new figures; ``emit`` sends an agent event."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        serving: Callable[[], ModelKey | None],
        committed: Callable[[], bool],
        measured: Callable[[], DeviceMeasurements | None],
        on_measured: Callable[[DeviceMeasurements], None],
        emit: Callable[[str, dict[str, Any]], None],
        command: Callable[[], list[str]] = child_command,
    ) -> None:
        self.config = config
        self.settings: ProfilingConfig = config.profiling
        self.serving = serving
        self.committed = committed
        self.measured = measured
        self.on_measured = on_measured
        self.emit = emit
        self.command = command
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._failed: dict[ModelKey, str] = {}  # not retried for the same model and release
        self._state: dict[str, Any] = {"state": "idle" if self.settings.on_install else "off"}

    # -- triggers ---------------------------------------------------------------------------------

    def on_event(self, name: str, detail: dict[str, Any]) -> None:
        """EventBus subscriber: a committed update, or a model loaded (start, SIGHUP, fallback)."""
        if name == "model_loaded" or (name == "ota_state" and detail.get("state") == "COMMITTED"):
            self.consider(name)

    def consider(self, trigger: str) -> bool:
        """Start profiling when the committed model serving has no figures of this device; True if started."""
        if not self.settings.on_install:
            return False
        key = self.serving()
        if key is None or not self.committed():
            return False  # nothing serving, or still on probation: profile once it is proven
        saved = self.measured()
        if saved is not None and (saved.model, saved.release) == key:
            return False
        with self._lock:
            if self._stopping or key in self._failed or (self._thread is not None and self._thread.is_alive()):
                return False
            self._state = {
                "state": "running",
                "model": key[0],
                "release": key[1],
                "trigger": trigger,
                "started_at": round(time.time(), 3),
            }
            self._thread = threading.Thread(target=self._run, args=(key,), name="install-profiling", daemon=True)
            self._thread.start()
        log.info("profiling %s release %d on this device in the background (%s)", key[0], key[1], trigger)
        return True

    # -- the run ----------------------------------------------------------------------------------

    def _run(self, key: ModelKey) -> None:
        problem = self._profile_in_child()
        figures = self.measured() if problem is None else None
        if problem is None and (figures is None or (figures.model, figures.release) != key):
            problem = "the profiling child exited without writing figures for this model"
        with self._lock:
            finished = {**self._state, "finished_at": round(time.time(), 3)}
            if problem is not None or figures is None:
                self._failed[key] = problem or "?"
                self._state = {**finished, "state": "failed", "reason": problem}
            else:
                self._state = {**finished, "state": "done", "speed_ladder": list(figures.speed_ladder)}
        if problem is not None or figures is None:
            log.warning("profiling %s release %d failed: %s", key[0], key[1], problem)
            self.emit("profiling_failed", {"model": key[0], "release": key[1], "reason": problem})
            return
        summary = figures.summary()
        self.emit(
            "profiled",
            {
                "model": figures.model,
                "release": figures.release,
                "speed_ladder": ",".join(figures.speed_ladder),
                **{f"p50_ms.{variant}": ms for variant, ms in summary.p50_ms.items()},
            },
        )
        try:
            self.on_measured(figures)
        except Exception:  # noqa: BLE001 - the model serving now stays up whatever the reload does
            log.exception("applying the measured ladder failed; the model loaded before keeps serving")

    def _profile_in_child(self) -> str | None:
        """Run the child to completion; None on success, else the reason (one line)."""
        try:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd="/",  # "-m" puts the working directory first on sys.path (see agent/unseal.py)
            )
        except OSError as exc:
            return f"cannot start the profiling child ({sys.executable}): {exc}"
        with self._lock:
            self._proc = proc
            stopping = self._stopping
        if stopping:
            proc.kill()
        try:
            _, err = proc.communicate(self.config.model_dump_json().encode(), timeout=self.settings.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return f"took longer than profiling.timeout_s ({self.settings.timeout_s:g} s); stopped"
        finally:
            with self._lock:
                self._proc = None
        if proc.returncode == 0:
            return None
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        return (lines[-1] if lines else f"the profiling child exited with {proc.returncode}")[:300]

    # -- reporting, stopping --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``/v1/status``'s ``profiling``: off, idle, running, done (the ladder) or failed (why)."""
        with self._lock:
            return dict(self._state)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop a running child (the agent is stopping); its half-written figures are never renamed in."""
        with self._lock:
            self._stopping = True
            proc, thread = self._proc, self._thread
        if proc is not None and proc.poll() is None:
            proc.kill()
        if thread is not None:
            thread.join(timeout)


def _die_with_the_agent() -> None:
    """Linux: SIGKILL this child when the daemon dies (a SIGKILLed agent leaves no orphan profiling
    on, holding decrypted models and the CPU); elsewhere the timeout ends it."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the daemon died before the call: nobody is waiting for the figures
        os._exit(1)


def main() -> int:
    """The child: the agent's config (JSON) on stdin; time the installed model; exit 0 when saved."""
    from edgesdk.agent.hardening import harden_process

    harden_process()  # it holds decrypted models too: no core file
    _die_with_the_agent()
    try:
        config = AgentConfig.model_validate_json(sys.stdin.buffer.read())
        os.nice(config.profiling.nice)
        from edgesdk.agent.daemon import Agent
        from edgesdk.agent.profiling import profile_installed

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        profile_installed(Agent(config), warmup=config.profiling.warmup, runs=config.profiling.runs)
    except (EdgeSDKError, ValueError, OSError) as exc:
        print(f"profiling: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
