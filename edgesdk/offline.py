"""Keep runtimes from phoning home.

onnxruntime, OpenVINO and NNCF collect usage telemetry unless told not to. The switches
only work if they are set before those libraries are imported, so every entry point that
may import a runtime (the agent, the converters) calls :func:`disable_vendor_telemetry`
first. It only sets variables and an opt-out file under the current HOME; it never
imports a runtime itself.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment switches honoured by the runtimes we ship with.
TELEMETRY_ENV = {
    "ORT_DISABLE_TELEMETRY": "1",  # onnxruntime: no ~/.cache/Microsoft/DeveloperTools
    "OPENVINO_TELEMETRY_OPT_OUT": "1",
    "NNCF_TELEMETRY_OPT_OUT": "1",
    "OPENVINO_NO_TELEMETRY": "1",
}


def disable_vendor_telemetry() -> None:
    """Set every known opt-out before a runtime is imported. Safe to call many times."""
    for key, value in TELEMETRY_ENV.items():
        os.environ.setdefault(key, value)
    # openvino-telemetry checks CI=true and, failing that, an opt-in file it keeps under
    # ~/intel. Without a file it asks (and may create the folder), so the agent sets CI
    # only in its own process environment when nothing set it, which the library reads as
    # "do not send".
    os.environ.setdefault("CI", "true")


def telemetry_dirs(home: Path) -> list[Path]:
    """Where vendor telemetry would leave traces under ``home`` (checked by tests)."""
    return [home / ".cache" / "Microsoft", home / "intel"]
