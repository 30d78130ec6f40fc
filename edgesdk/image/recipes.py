"""Firmware recipes: which device family a profile belongs to, and that family's overlay."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from edgesdk.errors import ImageError
from edgesdk.schemas.profile import DeviceProfile

UNIT_PATH = "etc/systemd/system/edge-agent.service"


@dataclass(frozen=True)
class Recipe:
    """One device family: ``firmware_images/<family>/recipe.yaml`` and its ``overlay/``."""

    family: str
    description: str
    arch: str
    os_patterns: tuple[str, ...]
    user_groups: tuple[str, ...]
    directory: Path

    @property
    def overlay(self) -> Path:
        return self.directory / "overlay"

    @property
    def unit_file(self) -> Path:
        return self.overlay / UNIT_PATH

    def fits(self, profile: DeviceProfile) -> bool:
        """True when the profile's OS image and CPU are what this family's recipe is for."""
        return profile.platform.arch == self.arch and any(p in profile.platform.os for p in self.os_patterns)


def firmware_dir() -> Path:
    """The shipped ``firmware_images`` folder (package ``edgesdk.firmware_images``)."""
    return Path(str(resources.files("edgesdk.firmware_images")))


def common_dir() -> Path:
    """Files every family shares: ``install.sh`` and ``layout.tsv``."""
    return firmware_dir() / "common"


def _load(path: Path) -> Recipe:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Recipe(
            family=str(data["family"]),
            description=str(data["description"]),
            arch=str(data["arch"]),
            os_patterns=tuple(str(p) for p in data["os_patterns"]),
            user_groups=tuple(str(g) for g in data.get("user_groups", [])),
            directory=path.parent,
        )
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ImageError(f"firmware recipe {path} is unreadable or incomplete: {exc}") from exc


def load_recipes() -> dict[str, Recipe]:
    """Every family recipe, by family name."""
    recipes = [_load(p) for p in sorted(firmware_dir().glob("*/recipe.yaml"))]
    return {r.family: r for r in recipes}


def recipe_for(profile: DeviceProfile, family: str | None = None) -> Recipe:
    """The recipe for a profile: the one named by ``family``, else the first that fits."""
    recipes = load_recipes()
    if family is not None:
        if family not in recipes:
            raise ImageError(f"firmware family {family!r} not found; known: {', '.join(recipes)}")
        recipe = recipes[family]
        if recipe.arch != profile.platform.arch:
            raise ImageError(
                f"firmware family {family!r} is for {recipe.arch} but profile {profile.name!r} "
                f"is {profile.platform.arch}"
            )
        return recipe
    for recipe in recipes.values():
        if recipe.fits(profile):
            return recipe
    raise ImageError(
        f"no firmware recipe fits profile {profile.name!r} ({profile.platform.os}, {profile.platform.arch}); "
        f"known families: {', '.join(recipes)} (choose one with --family)"
    )
