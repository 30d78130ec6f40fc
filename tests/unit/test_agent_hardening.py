"""harden_process: after it, no core limit and (on Linux) not dumpable; a control shows both before."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource
from edgesdk.agent.hardening import harden_process, is_dumpable
before = (resource.getrlimit(resource.RLIMIT_CORE)[0], is_dumpable())
done = harden_process()
print(json.dumps({"before": before, "done": done, "after": [resource.getrlimit(resource.RLIMIT_CORE), is_dumpable()]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_DUMPABLE) is Linux-only")
def test_harden_process_clears_the_core_limit_and_the_dumpable_flag() -> None:
    out = subprocess.run(
        ["bash", "-c", f"ulimit -c unlimited && exec {sys.executable} -c '{PROBE}'"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["before"][1] is True and result["before"][0] != 0  # the control: a plain process
    assert result["done"] == {"rlimit_core_0": True, "not_dumpable": True}
    assert result["after"] == [[0, 0], False]
