"""Each part of edgesdk imports only the parts it may: the layering in every direction.

docs/architecture.md draws three sides. The device agent (``edgesdk.agent``) runs on a Pi; the
host tools (the CLI, the converters, the fleet tools and service, the image builder, the demo)
run on a workstation or server; what both need (schemas, MQTT topics, chunk frames, signing,
runtimes, bundles, the MQTT adapter, the console's exit codes) is the shared core. So:

* the device imports only the shared core: never the host CLI, the converters or the fleet;
* the host never imports the device; within the host, the converters, the fleet, the client,
  the image builder and the workloads import only the shared core (the library, the demo and
  the CLI compose them);
* the shared core imports neither side.

:data:`MAY_IMPORT` is that table. Two kinds of check keep it:

* a fresh interpreter imports every host module with the device blocked, and every device
  module with the host blocked (what runs);
* an AST scan of every source file finds every import, even one inside a function that the
  import walk never executes, and checks it against the table (what could run).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = "shared core"
DEVICE = "device agent"

#: Module prefix → the part it belongs to (the longest matching prefix wins).
PART_OF: dict[str, str] = {
    "edgesdk": "package root",  # lazy (PEP 562): names load on first use, see edgesdk/__init__.py
    "edgesdk.agent": DEVICE,
    "edgesdk.cli": "host CLI",
    "edgesdk.toolchain": "host library",
    "edgesdk.converters": "converters",
    "edgesdk.fleet": "fleet",
    "edgesdk.client": "client",
    "edgesdk.image": "image builder",
    "edgesdk.demo": "demo",
    "edgesdk.workloads": "workloads",
    **dict.fromkeys(
        (
            "edgesdk._version",
            "edgesdk.bundle",
            "edgesdk.capture",
            "edgesdk.console",
            "edgesdk.device_profiles",
            "edgesdk.drift",
            "edgesdk.errors",
            "edgesdk.firmware_images",
            "edgesdk.hashing",
            "edgesdk.keys",
            "edgesdk.mqtt",
            "edgesdk.offline",
            "edgesdk.pipeline",
            "edgesdk.profiles",
            "edgesdk.protocol",
            "edgesdk.quality",
            "edgesdk.runtimes",
            "edgesdk.schemas",
            "edgesdk.trust",
        ),
        SHARED,
    ),
}

_BELOW_ALL = {SHARED, "package root"}
#: Part → the parts it may import besides itself.
MAY_IMPORT: dict[str, set[str]] = {
    SHARED: _BELOW_ALL,
    DEVICE: _BELOW_ALL,
    "converters": _BELOW_ALL,
    "fleet": _BELOW_ALL,
    "client": _BELOW_ALL,
    "image builder": _BELOW_ALL,
    "workloads": _BELOW_ALL,
    "host library": _BELOW_ALL | {"converters", "fleet"},
    "demo": _BELOW_ALL | {"converters", "fleet", "image builder", "workloads"},
    "host CLI": _BELOW_ALL | {"host library", "converters", "fleet", "client", "image builder", "demo", "workloads"},
    "package root": _BELOW_ALL | {"host library", "client"},
}
HOST_PARTS = set(MAY_IMPORT) - {SHARED, DEVICE, "package root"}
#: The installed packages whose files are scanned (the folders mapped under edgesdk.*).
SOURCE_ROOTS = ("edgesdk", "edgesdk.agent", "edgesdk.converters", "edgesdk.device_profiles", "edgesdk.firmware_images")


def part_of(module: str) -> str | None:
    parts = module.split(".")
    for length in range(len(parts), 0, -1):
        found = PART_OF.get(".".join(parts[:length]))
        if found is not None:
            return found
    return None


def prefixes_of(parts: set[str]) -> tuple[str, ...]:
    return tuple(sorted(prefix for prefix, part in PART_OF.items() if part in parts))


# Runs in a fresh interpreter: the blocker must be in place before any edgesdk module loads.
# Every attempt is recorded as well as refused, so a module that catches the ImportError and
# carries on (``try: import edgesdk.agent... except ImportError``) is still caught.
WALK = r"""
import importlib, json, pkgutil, sys, traceback

attempts = []

def is_blocked(name):
    return any(name == prefix or name.startswith(prefix + ".") for prefix in BLOCKED)

class ImportBlocked(ImportError):
    pass

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if is_blocked(name):
            # Only the project's frames: the importlib machinery in between says nothing.
            frames = [f for f in traceback.extract_stack() if not f.filename.startswith("<")]
            attempts.append((name, "".join(traceback.format_list(frames[-6:]))))
            raise ImportBlocked(f"imported {name}", name=name)
        return None

sys.meta_path.insert(0, Blocker())

imported, skipped, errors = [], {}, {}

def try_import(name):
    try:
        module = importlib.import_module(name)
    except ImportBlocked as exc:
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
    if name in seen or is_blocked(name):
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
    "blocked_loaded": sorted(m for m in sys.modules if is_blocked(m)),
}))
"""


def run_walk(roots: tuple[str, ...], blocked: tuple[str, ...]) -> dict:
    code = f"ROOTS = {roots!r}\nBLOCKED = {blocked!r}\n{WALK}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def walk_result() -> dict:
    """Every host (and shared) module imported with the device agent blocked."""
    host_roots = ("edgesdk", "edgesdk.converters", "edgesdk.device_profiles", "edgesdk.firmware_images")
    return run_walk(host_roots, prefixes_of({DEVICE}))


@pytest.fixture(scope="module")
def device_walk_result() -> dict:
    """Every device module imported with every host part blocked."""
    return run_walk(("edgesdk.agent",), prefixes_of(HOST_PARTS))


def assert_clean_walk(result: dict, what: str, expected: tuple[str, ...]) -> None:
    if result["attempts"]:
        attempts = "\n".join(f"{name} from:\n{stack}" for name, stack in result["attempts"])
        pytest.fail(f"{what}:\n{attempts}")
    assert result["errors"] == {}
    assert result["blocked_loaded"] == []
    imported = set(result["imported"])
    # The walk really covered the side (a walk that found nothing would pass the above).
    for module in expected:
        assert module in imported or module in result["skipped"], f"the walk never reached {module}"


def test_every_host_module_imports_with_the_agent_blocked(walk_result: dict) -> None:
    expected = (
        "edgesdk.cli.main",
        "edgesdk.fleet.rollout",
        "edgesdk.fleet.chunk_server",
        "edgesdk.protocol.topics",
        "edgesdk.protocol.chunks",
        "edgesdk.protocol.signing",
        "edgesdk.protocol.ota",
        "edgesdk.runtimes.registry",
        "edgesdk.image.builder",
        "edgesdk.demo.story",
        "edgesdk.converters.pipeline",
        "edgesdk.converters.validate",
    )
    assert_clean_walk(walk_result, "host code tried to import the device agent", expected)


def test_every_device_module_imports_with_the_host_blocked(device_walk_result: dict) -> None:
    expected = ("edgesdk.agent.cli", "edgesdk.agent.daemon", "edgesdk.agent.link", "edgesdk.agent.ota.manager")
    assert_clean_walk(device_walk_result, "device code tried to import host code", expected)


@pytest.mark.parametrize("result_name", ["walk_result", "device_walk_result"])
def test_no_module_was_left_out_of_the_import_walks(request: pytest.FixtureRequest, result_name: str) -> None:
    # The AST scan below still covers these files; this says which ones were not imported.
    skipped = request.getfixturevalue(result_name)["skipped"]
    if skipped:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(skipped.items()))
        pytest.skip(f"not imported in the layering walk: {reasons}")


def source_files() -> dict[str, Path]:
    """Module name → source file, for every module of every part (found on disk, nothing imported)."""
    files: dict[str, Path] = {}
    for root in SOURCE_ROOTS:
        spec = importlib.util.find_spec(root)
        assert spec is not None and spec.submodule_search_locations, f"{root} is not an installed package"
        for folder in map(Path, spec.submodule_search_locations):
            for path in sorted(folder.rglob("*.py")):
                parts = path.relative_to(folder).with_suffix("").parts
                name = ".".join((root, *parts)).removesuffix(".__init__")
                files.setdefault(name, path)  # an installed layout has agent/ inside edgesdk/ too
    return files


def imports_in(module: str, path: Path) -> list[tuple[int, str]]:
    """Every edgesdk module one source file imports, at any depth, as (line, module)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            # `from edgesdk import agent` imports a part; `from edgesdk.x import name` imports edgesdk.x.
            found += [(node.lineno, f"{origin}.{alias.name}") for alias in node.names if origin == "edgesdk"]
            found.append((node.lineno, origin))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return [(line, target) for line, target in found if target == "edgesdk" or target.startswith("edgesdk.")]


def forbidden_imports(module: str, path: Path) -> list[str]:
    """The imports of one file that its part may not make, as 'file:line: part → part (module)'."""
    source = part_of(module)
    if source is None:
        return [f"{path}: {module} belongs to no part of PART_OF"]
    allowed = MAY_IMPORT[source] | {source}
    wrong = []
    for line, target in imports_in(module, path):
        target_part = part_of(target) or "package root"  # `from edgesdk import __version__`
        if target_part not in allowed:
            wrong.append(f"{path}:{line}: {source} imports {target_part} ({target})")
    return wrong


def test_every_module_belongs_to_a_part_of_the_table() -> None:
    files = source_files()
    assert "edgesdk.agent.cli" in files and "edgesdk.converters.validate" in files, sorted(files)
    assert [module for module in files if part_of(module) is None] == []
    assert set(PART_OF.values()) == set(MAY_IMPORT)


def test_no_module_imports_a_part_it_may_not_even_lazily() -> None:
    found = [line for module, path in source_files().items() for line in forbidden_imports(module, path)]
    assert found == [], "imports across the layering (docs/architecture.md):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("edgesdk.fleet.mod", "import edgesdk.agent.runtimes\n"),
        ("edgesdk.fleet.service.mod", "from edgesdk.agent.ota import states\n"),
        ("edgesdk.demo.mod", "from edgesdk import agent\n"),
        ("edgesdk.image.mod", "def later():\n    from edgesdk.agent.serving import Serving\n"),
        ("edgesdk.cli.mod", "import importlib\nimportlib.import_module('edgesdk.agent.cli')\n"),
        ("edgesdk.fleet.mod", "from ..agent import link\n"),
        ("edgesdk.agent.cli", "from edgesdk.cli.main import run_cli\n"),
        ("edgesdk.agent.api.app", "def later():\n    from edgesdk.converters import pipeline\n"),
        ("edgesdk.agent.daemon", "from ..fleet import rollout\n"),
        ("edgesdk.converters.mod", "from edgesdk.fleet.rollout import RolloutPlan\n"),
        ("edgesdk.fleet.mod", "import edgesdk.cli.main\n"),
        ("edgesdk.mqtt.mod", "from edgesdk.demo import story\n"),
        ("edgesdk.schemas.mod", "from edgesdk.agent.config import load_config\n"),
    ],
)
def test_the_scan_sees_every_forbidden_import(tmp_path: Path, module: str, source: str) -> None:
    # The scan above passes only if it can fail: each of these must be reported.
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert forbidden_imports(module, path), source


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("edgesdk.demo.mod", 'import sys\nCMD = [sys.executable, "-m", "edgesdk.agent.cli"]\n'),
        ("edgesdk.agent.cli", "from edgesdk.console import run_cli\nfrom edgesdk import errors\n"),
        ("edgesdk.cli.mod", "from edgesdk.fleet import rollout\nfrom edgesdk.converters import pipeline\n"),
        ("edgesdk.agent.mod", "from . import link\nfrom edgesdk import __version__\n"),
    ],
)
def test_the_scan_allows_what_the_table_allows(tmp_path: Path, module: str, source: str) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert forbidden_imports(module, path) == []
