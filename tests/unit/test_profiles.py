from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.profiles import builtin_profile_dir, get_profile, load_profile_file, load_profiles
from edgesdk.schemas import DeviceProfile


def builtin_files() -> list[Path]:
    return sorted(builtin_profile_dir().glob("*.yaml"))


def test_at_least_ten_real_profiles_ship() -> None:
    assert len(builtin_files()) >= 10


@pytest.mark.parametrize("path", builtin_files(), ids=lambda p: p.stem)
def test_every_profile_file_validates(path: Path) -> None:
    profile = load_profile_file(path)
    assert isinstance(profile, DeviceProfile)
    assert profile.name == path.stem
    assert profile.sources, "every figure needs a source"
    # The governor must act before the hardware does.
    assert profile.thermal.step_down_c < profile.thermal.throttle_c


def test_extends_merges_parent(tmp_path: Path) -> None:
    base = yaml.safe_load((builtin_profile_dir() / "rpi4-4gb.yaml").read_text())
    (tmp_path / "my-pi.yaml").write_text(
        yaml.safe_dump({"name": "my-pi", "extends": "rpi4-4gb", "display_name": "My Pi", "memory": {"ram_mb": 1024}})
    )
    profile = get_profile("my-pi", [tmp_path])
    assert profile.memory.ram_mb == 1024
    assert profile.memory.model_ram_budget_mb == base["memory"]["model_ram_budget_mb"]
    assert profile.cpu.model == base["cpu"]["model"]
    assert profile.extends == "rpi4-4gb"


def test_user_dir_via_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lab-board.yaml").write_text(
        yaml.safe_dump({"name": "lab-board", "extends": "rpi5-8gb", "display_name": "Lab board"})
    )
    monkeypatch.setenv("EDGESDK_PROFILE_PATH", str(tmp_path))
    assert "lab-board" in load_profiles()


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ProfileError) as info:
        get_profile("rpi9")
    message = str(info.value)
    assert "'rpi9' not found" in message and "rpi5-8gb" in message


def test_broken_profile_names_file_and_field(tmp_path: Path) -> None:
    data = yaml.safe_load((builtin_profile_dir() / "rpi5-8gb.yaml").read_text())
    data["name"] = "broken"
    data["cpu"]["cores"] = -4
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as info:
        load_profile_file(tmp_path / "broken.yaml")
    message = str(info.value)
    assert "broken.yaml" in message and "cpu.cores" in message and "-4" in message


def test_unknown_field_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({"name": "typo", "extends": "rpi5-8gb", "ram_gb": 8}))
    with pytest.raises(ProfileError, match="ram_gb"):
        get_profile("typo", [tmp_path])


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: bad\ncpu: [1, 2\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: invalid YAML at line \d"):
        load_profile_file(tmp_path / "bad.yaml")


def test_extends_cycle_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\nextends: b\n")
    (tmp_path / "b.yaml").write_text("name: b\nextends: a\n")
    with pytest.raises(ProfileError, match="cycle"):
        get_profile("a", [tmp_path])


def test_thermal_points_must_be_ordered(tmp_path: Path) -> None:
    (tmp_path / "hot.yaml").write_text(
        yaml.safe_dump({"name": "hot", "extends": "rpi5-8gb", "thermal": {"step_down_c": 90.0}})
    )
    with pytest.raises(ProfileError, match="step_up_c < step_down_c < throttle_c"):
        get_profile("hot", [tmp_path])
