"""A native runtime's error as one line a user can act on: the C++ framing dropped.

OpenVINO opens its messages with where in its C++ sources they were raised (``Exception from
src/inference/src/cpp/infer_request.cpp:224:``, ``Check '…' failed at src/…cpp:669:``) and says
why lines below; LiteRT's reporter runs messages together with no newline ("node #29failed to
delegate"). :func:`one_line` keeps the words and the cause. Shared core: the converters clean
toolchain messages with it (converters/toolchain_errors.py) and the runtimes clean theirs, which
the device agent shows in its errors and refusals.
"""

from __future__ import annotations

import re

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
