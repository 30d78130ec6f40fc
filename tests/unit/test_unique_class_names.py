"""One name per concept: no two public classes of the shipped code share a name.

Two classes named alike are two concepts a reader must tell apart by their module (issue 39 found
``MemoryBudget`` twice, the model RAM and the API's request bytes, and the governor's ``Event``
beside the event bus's). docs/architecture.md ("Names that look alike") lists the near misses.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The folders that ship (edgesdk, and the ones installed as edgesdk.agent and edgesdk.converters).
SHIPPED = ("edgesdk", "agent", "converters")


def public_classes(source: str) -> list[str]:
    """The names of a module's top-level classes that do not start with an underscore."""
    tree = ast.parse(source)
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]


def class_name_clashes(paths: list[Path], root: Path) -> dict[str, list[str]]:
    """Class name → the files (relative to ``root``) defining it, for names defined more than once."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for name in public_classes(path.read_text()):
            where[name].append(str(path.relative_to(root)))
    return {name: files for name, files in where.items() if len(files) > 1}


def test_no_two_public_classes_share_a_name() -> None:
    paths = [path for folder in SHIPPED for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(paths) > 100, "the scan found too few modules to mean anything"
    clashes = class_name_clashes(paths, ROOT)
    assert clashes == {}, f"public classes with the same name (rename one of each): {clashes}"


def test_the_clash_scan_sees_two_classes_of_one_name(tmp_path: Path) -> None:
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("class Budget:\n    pass\n\nclass _Private:\n    pass\n")
    second.write_text("class Budget(int):\n    pass\n\nclass _Private:\n    pass\n")
    assert class_name_clashes([first, second], tmp_path) == {"Budget": ["a.py", "b.py"]}
