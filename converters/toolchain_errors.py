"""The line of a toolchain's error that says *why*, for the one-line reason in the report.

OpenVINO's frontend opens every message with a C++ assertion (``Check 'false' failed at
src/frontends/common_translators/src/unconverted_ops_report.cpp:151:``) and buries the cause
("Cannot get length of dynamic dimension", "input data tensor's rank has to be known") lines
below, after the op it failed on. Keeping the first line, or the last ("Summary: …"), drops
the cause. :func:`native_cause` keeps the op and the cause; ``EDGESDK_DEBUG=1`` also writes
the whole native message to stderr, where the CLI leaves it.
"""

from __future__ import annotations

import os
import sys

from edgesdk.runtimes.native_messages import one_line

__all__ = ["native_cause", "one_line"]


def native_cause(message: str, tool: str) -> str:
    """One line: the op(s) and the cause(s) in ``message``, framing dropped (first line if nothing is left).

    With ``EDGESDK_DEBUG=1`` the whole message goes to stderr too."""
    if os.environ.get("EDGESDK_DEBUG"):
        sys.stderr.write(f"--- {tool}'s whole message ---\n{message.rstrip()}\n--- end of {tool}'s message ---\n")
    return one_line(message)
