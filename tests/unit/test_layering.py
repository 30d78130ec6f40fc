"""Host code never imports the device: ``edgesdk.agent`` stays out of every other module.

The fleet tools, the CLI, the converters and the image builder run on a workstation; what they
share with the device (MQTT topics, chunk frames, deployment signing, OTA state names, runtime
backends) lives in ``edgesdk.protocol`` and ``edgesdk.runtimes``. Two checks keep it so:

* a fresh interpreter with ``edgesdk.agent`` blocked imports every host module (what runs);
* an AST scan of every host source file finds no import of ``edgesdk.agent``, not even one
  inside a function that the import walk never executes (what could run).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = "edgesdk.agent"
#: Host packages: the package root (less the agent) and the folders mapped under edgesdk.*.
HOST_ROOTS = ("edgesdk", "edgesdk.converters", "edgesdk.device_profiles", "edgesdk.firmware_images")

# Runs in a fresh interpreter: the blocker must be in place before any edgesdk module loads.
# Every attempt is recorded as well as refused, so a module that catches the ImportError and
# carries on (``try: import edgesdk.agent... except ImportError``) is still caught.
WALK = r"""
import importlib, json, pkgutil, sys, traceback

AGENT = "edgesdk.agent"
attempts = []

class AgentImportBlocked(ImportError):
    pass

class BlockAgent:
    def find_spec(self, name, path=None, target=None):
        if name == AGENT or name.startswith(AGENT + "."):
            # Only the project's frames: the importlib machinery in between says nothing.
            frames = [f for f in traceback.extract_stack() if not f.filename.startswith("<")]
            attempts.append((name, "".join(traceback.format_list(frames[-6:]))))
            raise AgentImportBlocked(f"host code imported {name}", name=name)
        return None

sys.meta_path.insert(0, BlockAgent())

def is_agent(name):
    return name == AGENT or name.startswith(AGENT + ".")

imported, skipped, errors = [], {}, {}

def try_import(name):
    try:
        module = importlib.import_module(name)
    except AgentImportBlocked as exc:
        errors[name] = f"imports {exc.name}"
        return None
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing and missing != "edgesdk":
            skipped[name] = f"optional dependency {exc.name!r} is not installed ({exc})"
        else:
            errors[name] = f"{type(exc).__name__}: {exc}"
        return None
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        return None
    imported.append(name)
    return module

seen = set()

def walk(name):
    if name in seen or is_agent(name):
        return
    seen.add(name)
    module = try_import(name)
    path = getattr(module, "__path__", None)
    if path is None:
        return
    for info in pkgutil.iter_modules(path, name + "."):
        walk(info.name)

for root in ROOTS:
    walk(root)

print(json.dumps({
    "imported": imported,
    "skipped": skipped,
    "errors": errors,
    "attempts": attempts,
    "agent_loaded": sorted(m for m in sys.modules if is_agent(m)),
}))
"""


@pytest.fixture(scope="module")
def walk_result() -> dict:
    code = f"ROOTS = {HOST_ROOTS!r}\n{WALK}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_host_module_imports_with_the_agent_blocked(walk_result: dict) -> None:
    if walk_result["attempts"]:
        attempts = "\n".join(f"{name} from:\n{stack}" for name, stack in walk_result["attempts"])
        pytest.fail(f"host code tried to import the agent:\n{attempts}")
    assert walk_result["errors"] == {}
    assert walk_result["agent_loaded"] == []
    imported = set(walk_result["imported"])
    # The walk really covered the host side (a walk that found nothing would pass the above).
    for expected in (
        "edgesdk.cli.main",
        "edgesdk.fleet.rollout",
        "edgesdk.fleet.chunk_server",
        "edgesdk.fleet.deployments",
        "edgesdk.protocol.topics",
        "edgesdk.protocol.chunks",
        "edgesdk.protocol.signing",
        "edgesdk.protocol.ota",
        "edgesdk.runtimes.registry",
        "edgesdk.image.builder",
        "edgesdk.demo.story",
        "edgesdk.converters.pipeline",
        "edgesdk.converters.validate",
    ):
        assert expected in imported or expected in walk_result["skipped"], f"the walk never reached {expected}"


def test_no_host_module_was_left_out_of_the_import_walk(walk_result: dict) -> None:
    # The AST scan below still covers these files; this says which ones were not imported.
    if walk_result["skipped"]:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(walk_result["skipped"].items()))
        pytest.skip(f"not imported in the layering walk: {reasons}")


def host_source_files() -> dict[str, Path]:
    """Module name → source file, for every host module (found on disk, nothing imported)."""
    files: dict[str, Path] = {}
    for root in HOST_ROOTS:
        spec = importlib.util.find_spec(root)
        assert spec is not None and spec.submodule_search_locations, f"{root} is not an installed package"
        for folder in map(Path, spec.submodule_search_locations):
            for path in sorted(folder.rglob("*.py")):
                parts = path.relative_to(folder).with_suffix("").parts
                name = ".".join((root, *parts))
                if name.endswith(".__init__"):
                    name = name[: -len(".__init__")]
                if name == AGENT or name.startswith(AGENT + "."):
                    continue  # an installed (non-editable) layout has agent/ inside edgesdk/
                files[name] = path
    return files


def agent_imports(module: str, path: Path) -> list[str]:
    """Every import of edgesdk.agent in one source file, at any depth, as 'line: text'."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[str] = []

    def hit(node: ast.AST, target: str) -> None:
        if target == AGENT or target.startswith(AGENT + "."):
            found.append(f"{path}:{getattr(node, 'lineno', '?')}: {target}")

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hit(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            if origin == AGENT or origin.startswith(AGENT + "."):
                hit(node, origin)
            else:
                for alias in node.names:  # `from edgesdk import agent`
                    hit(node, f"{origin}.{alias.name}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                hit(node, node.args[0].value)
    return found


def test_no_host_source_file_imports_the_agent_even_lazily() -> None:
    files = host_source_files()
    assert "edgesdk.fleet.rollout" in files and "edgesdk.converters.validate" in files, sorted(files)
    found = [line for module, path in files.items() for line in agent_imports(module, path)]
    assert found == [], "host code imports the device agent:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import edgesdk.agent.runtimes\n",
        "from edgesdk.agent.ota import states\n",
        "from edgesdk import agent\n",
        "def later():\n    from edgesdk.agent.serving import Serving\n",
        "import importlib\nimportlib.import_module('edgesdk.agent.cli')\n",
        "from ..agent import link\n",
    ],
)
def test_the_scan_sees_every_way_of_importing_the_agent(tmp_path: Path, source: str) -> None:
    # The scan above passes only if it can fail: each of these forms must be reported.
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert agent_imports("edgesdk.fleet.mod", path), source


def test_the_scan_leaves_command_lines_alone(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text('import sys\nCMD = [sys.executable, "-m", "edgesdk.agent.cli"]\n')
    assert agent_imports("edgesdk.demo.mod", path) == []
