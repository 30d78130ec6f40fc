"""Finding, loading and validating device profiles.

Profiles are plain YAML under ``device_profiles/`` (shipped inside the package as
``edgesdk.device_profiles``). Users add their own directories with ``EDGESDK_PROFILE_PATH``
(``os.pathsep``-separated) or ``--profiles-dir``; a user profile with the name of a built-in
one replaces it. A profile may ``extends:`` another: mappings merge key by key, lists and
scalars of the child replace the parent's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from edgesdk.errors import ProfileError, SchemaError
from edgesdk.schemas.profile import DeviceProfile

PROFILE_PATH_ENV = "EDGESDK_PROFILE_PATH"


@dataclass(frozen=True)
class ProfileSource:
    name: str
    path: Path
    data: dict[str, Any]


def builtin_profile_dir() -> Path:
    """The directory of profiles shipped with edgesdk."""
    return Path(str(resources.files("edgesdk.device_profiles")))


def profile_dirs(extra: Iterable[Path | str] = ()) -> list[Path]:
    """Search order, lowest priority first: built-in, then EDGESDK_PROFILE_PATH, then ``extra``."""
    dirs = [builtin_profile_dir()]
    env = os.environ.get(PROFILE_PATH_ENV, "")
    dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [Path(p) for p in extra]
    return dirs


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"profile file {path}: invalid YAML{where}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def _collect_sources(extra: Iterable[Path | str]) -> dict[str, ProfileSource]:
    sources: dict[str, ProfileSource] = {}
    for directory in profile_dirs(extra):
        if not directory.is_dir():
            raise ProfileError(f"profile directory {directory} does not exist")
        for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
            data = _read_yaml(path)
            name = data.get("name", path.stem)
            if not isinstance(name, str):
                raise ProfileError(f"profile file {path}: field 'name' must be a string")
            if name != path.stem:
                raise ProfileError(f"profile file {path}: name {name!r} must match the file name {path.stem!r}")
            sources[name] = ProfileSource(name, path, data)
    return sources


def _deep_merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = dict(parent)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolve(name: str, sources: dict[str, ProfileSource], chain: tuple[str, ...] = ()) -> dict[str, Any]:
    source = sources[name]
    parent_name = source.data.get("extends")
    if parent_name is None:
        return source.data
    if parent_name in chain or parent_name == name:
        raise ProfileError(
            f"profile file {source.path}: 'extends' makes a cycle: {' -> '.join((*chain, name, parent_name))}"
        )
    if parent_name not in sources:
        raise ProfileError(
            f"profile file {source.path}: extends unknown profile {parent_name!r}; known: {', '.join(sorted(sources))}"
        )
    parent = dict(_resolve(parent_name, sources, (*chain, name)))
    # What the parent says about its own sources/identity is not inherited blindly:
    # the child names itself; sources accumulate so every figure keeps its citation.
    parent_sources = list(parent.get("sources", []))
    merged = _deep_merge(parent, source.data)
    merged["sources"] = list(dict.fromkeys([*source.data.get("sources", []), *parent_sources]))
    return merged


def _validate(source: ProfileSource, data: dict[str, Any]) -> DeviceProfile:
    try:
        return DeviceProfile.parse_obj_clear(data, source=f"profile file {source.path}")
    except SchemaError as exc:
        raise ProfileError(str(exc)) from exc


def load_profiles(extra_dirs: Iterable[Path | str] = ()) -> dict[str, DeviceProfile]:
    """Every profile found, validated, by name. Raises ProfileError naming the file and field."""
    sources = _collect_sources(list(extra_dirs))
    return {name: _validate(sources[name], _resolve(name, sources)) for name in sorted(sources)}


def get_profile(name: str, extra_dirs: Iterable[Path | str] = ()) -> DeviceProfile:
    """One profile by name; an unknown name lists the known ones."""
    sources = _collect_sources(list(extra_dirs))
    if name not in sources:
        raise ProfileError(f"profile {name!r} not found; known: {', '.join(sorted(sources))}")
    return _validate(sources[name], _resolve(name, sources))


def load_profile_file(path: Path | str) -> DeviceProfile:
    """Validate one profile file on its own (``extends`` resolved against built-in profiles)."""
    path = Path(path)
    data = _read_yaml(path)
    sources = _collect_sources([])
    name = data.get("name", path.stem)
    sources[name] = ProfileSource(name, path, data)
    return _validate(sources[name], _resolve(name, sources))
