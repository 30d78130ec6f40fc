"""The converter registry (like Olive's): every entry names a real module and class, capabilities
are consistent, and nothing heavy is imported to read them."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest
from edgesdk.converters.registry import CONVERTER_FOR_FORMAT, CONVERTERS, missing_packages

from edgesdk.schemas.common import RUNTIME_FORMAT, ModelFormat


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_entry_points_at_a_module_that_exists(name) -> None:
    module, _, cls = CONVERTERS[name].target.partition(":")
    assert importlib.util.find_spec(module) is not None, module
    assert cls


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_entry_imports_where_its_packages_are_installed(name) -> None:
    missing = missing_packages(name)
    if missing:
        pytest.skip(f"{name} needs {missing}")
    module, _, cls = CONVERTERS[name].target.partition(":")
    backend = getattr(importlib.import_module(module), cls)
    assert backend.capabilities is CONVERTERS[name].capabilities


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_capabilities_are_consistent(name) -> None:
    caps = CONVERTERS[name].capabilities
    assert RUNTIME_FORMAT[caps.runtime] == caps.format
    assert caps.int8_methods and caps.packages and caps.sources
    assert caps.extra.startswith("convert")


def test_every_format_has_one_converter() -> None:
    assert set(CONVERTER_FOR_FORMAT) == set(ModelFormat)


def test_reading_the_registry_and_planning_imports_no_heavy_package() -> None:
    code = (
        "import sys; import edgesdk.converters.planner, edgesdk.converters.registry; "
        "heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'openvino', 'nncf', 'coremltools', 'litert_torch') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
