"""An error the local API raises itself is one its answer counts (agent/api/refusal.py).

``InferenceInputError`` and ``RuntimeBackendError`` carry no error kind: the server counts them
where it checks and runs (agent/serving.py), so the answer does not count them again. Raised by
an API module instead (an unknown output, a dtype the protocol cannot name), one is answered
422 and counted nowhere: the API raises its own (``DeclaredInputError``, counted bad_input).
The prepared route's decoders are the exception: what they raise only declines a request to the
generic path, which answers and counts it (agent/api/prepared.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import edgesdk.agent.api

#: The errors only the server raises (and counts).
SERVERS_OWN = {"InferenceInputError", "RuntimeBackendError"}
#: (module, top-level function): raises that decline to the generic path, never answered.
DECLINES = {("plan.py", "_raw_decoder"), ("plan.py", "_json_decoder")}


def raises_of_the_servers_own_errors(path: Path) -> list[str]:
    found = []
    for top in ast.parse(path.read_text()).body:
        name = getattr(top, "name", "")
        if (path.name, name) in DECLINES:
            continue
        for node in ast.walk(top):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                called = node.exc.func
                if isinstance(called, ast.Name) and called.id in SERVERS_OWN:
                    found.append(f"{path.name}:{node.lineno} raises {called.id} (in {name or 'the module'})")
    return found


def test_no_api_module_raises_an_error_only_the_server_counts() -> None:
    api = Path(edgesdk.agent.api.__file__).parent
    modules = sorted(api.glob("*.py"))
    assert len(modules) > 10  # the package was found
    found = [line for path in modules for line in raises_of_the_servers_own_errors(path)]
    assert found == [], "raise DeclaredInputError (agent/api/codec.py) instead: " + "; ".join(found)
