"""Test modules in tests/unit, tests/contract and tests/integration are imported by their file
name (the tiers are not packages), so two files with the same name in different tiers stop the
whole run at collection ("import file mismatch"). This fails first, and names the files."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"test modules with the same file name (rename one of each): {clashes}"
