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
import re
import sys

#: Lines that locate an error in the toolchain's own sources or frame it, never say why.
_FRAMING = re.compile(
    r"^("
    r"Check '.*' failed at .*"
    r"|Exception from src/.*"
    r"|FrontEnd API failed with \w+:?"
    r"|Model wasn't fully converted.*"
    r"|Summary:"
    r"|-- Conversion is failed for: .*"
    r"|\[[A-Za-z ]*Frontend\] Conversion failed for .*"
    r"|Traceback \(most recent call last\):"
    r"|\s*File \".*\", line \d+.*"
    r")$"
)
#: "-- LpNormalization-17 with a message:": the op the cause below belongs to.
_FAILED_OP = re.compile(r"^-- (?P<op>\S+) with a message:$")
#: "OpenVINO rejected the input: Exception from src/…cpp:224:": our words, then the C++ location.
_TRAILING_LOCATION = re.compile(r"^(?P<head>.*?):?\s*Exception from src/\S+:\d+:$")
#: "While validating ONNX node '<Node(Reshape): y>': Exception from src/…": the node, then framing.
_WHILE = re.compile(r"^While validating (?:ONNX )?node '<Node\((?P<op>\w+)\): (?P<name>[^>]*)>'")

#: Where LiteRT's C++ error reporter runs two messages together with no newline between them
#: ("failed to delegate MAX_POOL_2D node #29failed to delegate …", "…(2 != 0)Node number 0 …").
_LITERT_GLUED = re.compile(r"(?<=\S)(?=failed to delegate |tflite/kernels/|Node number \d+ )")
#: "failed to delegate MAX_POOL_2D node #29": one of a run that reads better as one line.
_NOT_DELEGATED = re.compile(r"^(?P<head>.*?)failed to delegate (?P<op>\S+) node #(?P<node>\d+)$")


def native_cause(message: str, tool: str) -> str:
    """One line: the op(s) and the cause(s) in ``message``, framing dropped (first line if nothing is left).

    With ``EDGESDK_DEBUG=1`` the whole message goes to stderr too."""
    if os.environ.get("EDGESDK_DEBUG"):
        sys.stderr.write(f"--- {tool}'s whole message ---\n{message.rstrip()}\n--- end of {tool}'s message ---\n")
    return one_line(message)


def one_line(message: str) -> str:
    """``message`` with the framing lines dropped and the rest joined on one line."""
    lines = [line.strip() for line in _LITERT_GLUED.sub("\n", message).splitlines() if line.strip()]
    parts: list[str] = []
    current_op = ""
    for line in lines:
        failed = _FAILED_OP.match(line)
        if failed:
            current_op = failed.group("op")
            continue
        node = _WHILE.match(line)
        if node:
            current_op = current_op or node.group("op")
            if node.group("name"):
                current_op += f" (node {node.group('name')})"
            continue
        if _FRAMING.match(line):
            continue
        located = _TRAILING_LOCATION.match(line)
        if located:
            line = located.group("head").rstrip(": ")
            if not line:
                continue
        parts.append(f"{current_op}: {line}" if current_op else line)
        current_op = ""
    if not parts:
        return lines[0] if lines else "no message"
    unique = list(dict.fromkeys(_group_not_delegated(parts)))
    return "; ".join(unique)


def _group_not_delegated(parts: list[str]) -> list[str]:
    """Consecutive "failed to delegate OP node #N" lines of one op as one: "… OP nodes #29, #62"."""
    grouped: list[str] = []
    run: tuple[str, str, list[str]] | None = None  # (head, op, node numbers)
    for part in [*parts, ""]:
        match = _NOT_DELEGATED.match(part)
        if match and run is not None and match.group("op") == run[1] and not match.group("head"):
            run[2].append(match.group("node"))
            continue
        if run is not None:
            nodes = ", ".join(f"#{n}" for n in run[2])
            grouped.append(f"{run[0]}failed to delegate {run[1]} node{'s' if len(run[2]) > 1 else ''} {nodes}")
            run = None
        if match:
            run = (match.group("head"), match.group("op"), [match.group("node")])
        elif part:
            grouped.append(part)
    return grouped
