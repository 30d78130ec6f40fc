"""Log lines that journald understands.

The agent logs to stderr only; systemd's journal (or any supervisor) keeps them. With
``log_format = "journald"`` each line starts with the syslog priority in angle brackets
(``<6>model loaded ...``), which journald strips and stores as the entry's priority, so
``journalctl -p warning -u edge-agent`` works. ``"text"`` adds a timestamp and the level
for running by hand; ``"json"`` writes one JSON object per line for log shippers.
"""

from __future__ import annotations

import json
import logging
import sys
import time

#: logging level → syslog priority (sd-daemon(3)).
_SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

LOGGER_NAME = "edgesdk.agent"


class JournaldFormatter(logging.Formatter):
    """``<priority>logger: message`` — one line; tracebacks are folded onto it."""

    def format(self, record: logging.LogRecord) -> str:
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6)
        message = record.getMessage()
        if record.exc_info:
            message += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return f"<{priority}>{record.name}: {message}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        return f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


def setup_logging(level: str = "info", fmt: str = "journald") -> logging.Logger:
    """Send the agent's loggers to stderr in ``fmt``; returns the agent's root logger."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = {"journald": JournaldFormatter, "json": JsonFormatter}.get(fmt, TextFormatter)()
    handler.setFormatter(formatter)
    root = logging.getLogger("edgesdk")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    return logging.getLogger(LOGGER_NAME)
