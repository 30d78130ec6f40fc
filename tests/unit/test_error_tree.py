"""Every exception class the project defines is in the EdgeSDKError tree and drawn in its
docstring, and no broad ``except`` swallows an error without a word.

The modules are found from the source folders (not by importing packages), so a new module
is checked the day it is added. A module whose optional third-party dependency is missing here
is a visible skip naming that dependency; a missing project module is a failure.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesdk import errors
from edgesdk.errors import EdgeSDKError

ROOT = Path(__file__).resolve().parents[2]
#: source folder → the package it installs as (pyproject's package-dir mapping)
SOURCE_TREES = {"edgesdk": "edgesdk", "agent": "edgesdk.agent", "converters": "edgesdk.converters"}


def _source_files() -> Iterator[tuple[Path, str]]:
    for folder, package in SOURCE_TREES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield path, ".".join([package, *parts])


MODULES = [name for _, name in _source_files()]


def _import(name: str) -> object:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == "edgesdk" or missing.startswith("edgesdk."):
            raise  # our own module: an import error, not a missing extra
        pytest.skip(f"{name} needs {missing!r}, which is not installed here")


def _exception_classes(module: object, name: str) -> list[type[BaseException]]:
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == name
    ]


def _drawn_names() -> dict[str, str | None]:
    """Class name → the source file the drawing says it lives in (None: edgesdk/errors.py)."""
    drawn: dict[str, str | None] = {}
    for line in (errors.__doc__ or "").splitlines():
        if line.strip() == "EdgeSDKError":
            drawn["EdgeSDKError"] = None
        elif "── " in line:
            match = re.match(r"\s*(\w+)(?:\s+\(([\w/.]+\.py)\))?", line.split("── ", 1)[1])
            if match:
                drawn[match.group(1)] = match.group(2)
    return drawn


@pytest.mark.parametrize("name", MODULES)
def test_every_exception_class_is_in_the_tree_and_drawn(name: str) -> None:
    module = _import(name)
    drawn = _drawn_names()
    for cls in _exception_classes(module, name):
        if issubclass(cls, Warning):
            continue  # issued with warnings.warn, never raised: not an error of the tree
        assert issubclass(cls, EdgeSDKError), f"{name}.{cls.__name__} is not under EdgeSDKError"
        assert cls.__name__ in drawn, f"{name}.{cls.__name__} is not drawn in the tree of edgesdk/errors.py"


def test_the_drawing_names_real_classes_where_it_says() -> None:
    drawn = _drawn_names()
    assert len(drawn) > 30, drawn  # the parser still reads the drawing
    by_file = {str(path.relative_to(ROOT)): name for path, name in _source_files()}
    for class_name, where in drawn.items():
        module_name = "edgesdk.errors" if where is None else by_file.get(where)
        assert module_name, f"the drawing puts {class_name} in {where}, which is not a source file"
        module = _import(module_name)
        cls = getattr(module, class_name, None)
        assert isinstance(cls, type) and issubclass(cls, EdgeSDKError), f"{class_name} not in {module_name}"


# -- broad excepts ---------------------------------------------------------------------------------

_BROAD = {"Exception", "BaseException"}
_LOG_METHODS = {"exception", "error", "warning", "info", "debug", "critical", "log"}


def _is_broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in _BROAD for t in types)


def _speaks(handler: ast.ExceptHandler) -> bool:
    """It raises, logs, or hands the caught error on (stores, answers, formats it)."""
    for node in (n for statement in handler.body for n in ast.walk(statement)):
        if isinstance(node, ast.Raise):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _LOG_METHODS
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in {"os", "math", "np"})
        ):
            return True
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
            return True
    return False


def silent_broad_excepts(source: str, filename: str = "<source>") -> list[str]:
    """``file:line`` of every ``except Exception/BaseException/:`` that neither raises, nor logs,
    nor uses the error it caught."""
    tree = ast.parse(source, filename)
    return [
        f"{filename}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ExceptHandler) and _is_broad(node) and not _speaks(node)
    ]


def test_no_broad_except_swallows_an_error_silently() -> None:
    silent: list[str] = []
    for path, _ in _source_files():
        silent += silent_broad_excepts(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not silent, "broad excepts that neither raise, log nor pass the error on: " + ", ".join(silent)


@pytest.mark.parametrize(
    "body",
    [
        "pass",
        "continue",
        "return None",
        "x = None",
        "count += 1",
    ],
)
def test_the_check_finds_a_planted_silent_except(body: str) -> None:
    for clause in ("except Exception:", "except BaseException:", "except:", "except (OSError, Exception):"):
        source = f"for i in range(3):\n    try:\n        f()\n    {clause}\n        {body}\n"
        assert silent_broad_excepts(source) == ["<source>:4"], (clause, body)


@pytest.mark.parametrize(
    "handler",
    [
        "except Exception:\n        log.exception('f failed')",
        "except Exception:\n        self.log.warning('f failed for %s', i)",
        "except BaseException:\n        cleanup()\n        raise",
        "except Exception as exc:\n        raise UpdateError(f'f failed: {exc}') from exc",
        "except Exception as exc:\n        problem = f'f failed: {exc}'",
        "except OSError:\n        pass",  # narrowed: the expected error, a choice the reader can see
    ],
)
def test_the_check_accepts_a_handler_that_speaks(handler: str) -> None:
    source = f"def g(i):\n    try:\n        f()\n    {handler}\n"
    assert silent_broad_excepts(source) == []
