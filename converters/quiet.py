"""Silence the converters' own printing (progress lines, C++ logs) so the CLI output stays ours."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_native() -> Iterator[None]:
    """Send file descriptors 1 and 2 (Python and native code) to a scratch file for the block.

    ``EDGESDK_DEBUG=1`` leaves them alone.
    """
    if os.environ.get("EDGESDK_DEBUG"):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(open(os.devnull, "w")), contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
