"""The installed layout: agent/ and converters/ live under edgesdk.*, and the agent never
pulls converter weight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Converter-side packages the device must never import (or install).
CONVERTER_MODULES = [
    "torch",
    "onnx",
    "onnxscript",
    "onnxconverter_common",
    "coremltools",
    "nncf",
    "litert_torch",
    "ai_edge_quantizer",
    "matplotlib",
    "sklearn",
]


def test_every_package_folder_is_listed() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            dotted = ".".join([package, *relative.parts]) if relative.parts else package
            if "__pycache__" in dotted:
                continue
            assert dotted in listed, f"{init.parent} is not in [tool.setuptools] packages as {dotted}"


def test_agent_extra_carries_no_converter_dependency() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    device_side = extras["agent"] + extras["litert"] + extras["openvino"] + PYPROJECT["project"]["dependencies"]
    names = {dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower() for dep in device_side}
    assert not names & {
        "torch",
        "onnx",
        "onnxscript",
        "onnxconverter-common",
        "coremltools",
        "nncf",
        "litert-torch",
        "ai-edge-quantizer",
        "matplotlib",
        "scikit-learn",
    }


@pytest.mark.needs_agent_extra  # every agent module is imported, the MQTT link's paho included
def test_importing_the_agent_imports_no_converter_module() -> None:
    # A fresh interpreter that refuses converter imports outright: importing every agent
    # module must still work, and none of those modules may be in sys.modules afterwards.
    code = f"""
import importlib, pkgutil, sys
BLOCKED = {CONVERTER_MODULES!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError('agent imported converter module ' + name)
        return None
sys.meta_path.insert(0, Block())
import edgesdk.agent, edgesdk.protocol, edgesdk.runtimes
# The device also runs the shared protocol and runtime backends that live outside edgesdk.agent.
for package in (edgesdk.agent, edgesdk.protocol, edgesdk.runtimes):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):
        importlib.import_module(info.name)
leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
assert not leaked, leaked
print('ok')
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_agent_and_converters_are_not_top_level() -> None:
    import importlib.util

    assert importlib.util.find_spec("edgesdk.agent") is not None
    assert importlib.util.find_spec("edgesdk.converters") is not None
    assert importlib.util.find_spec("agent") is None or "site-packages" not in str(
        importlib.util.find_spec("agent").origin
    )
