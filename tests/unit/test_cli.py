from __future__ import annotations

import json

from tests.conftest import assert_one_line_error


def test_version(edgesdk_cli) -> None:
    proc = edgesdk_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("edgesdk ")


def test_profiles_list_json_lists_at_least_ten(edgesdk_cli) -> None:
    proc = edgesdk_cli("profiles", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    names = [p["name"] for p in json.loads(proc.stdout)]
    assert len(names) >= 10
    assert "rpi5-8gb" in names


def test_profiles_list_table(edgesdk_cli) -> None:
    proc = edgesdk_cli("profiles", "list")
    assert proc.returncode == 0, proc.stderr
    assert "rpi5-8gb" in proc.stdout and "device profiles" in proc.stdout


def test_profiles_show_json(edgesdk_cli) -> None:
    proc = edgesdk_cli("profiles", "show", "rpi4-4gb", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "rpi4-4gb"


def test_unknown_profile_is_one_line_listing_known(edgesdk_cli) -> None:
    proc = edgesdk_cli("profiles", "show", "rpi9")
    assert_one_line_error(proc, "'rpi9'", "known:", "rpi5-8gb")


def test_unknown_command_is_one_line(edgesdk_cli) -> None:
    proc = edgesdk_cli("frobnicate")
    assert_one_line_error(proc, "frobnicate", "known:")
    assert proc.returncode == 2


def test_unknown_option_is_one_line(edgesdk_cli) -> None:
    proc = edgesdk_cli("profiles", "list", "--colour")
    assert_one_line_error(proc, "--colour")


def test_broken_profile_dir_names_file_and_field(edgesdk_cli, tmp_path) -> None:
    (tmp_path / "bad-board.yaml").write_text("name: bad-board\nextends: rpi5-8gb\ncpu:\n  cores: zero\n")
    proc = edgesdk_cli("--profiles-dir", str(tmp_path), "profiles", "list")
    assert_one_line_error(proc, "bad-board.yaml", "cpu.cores", "'zero'")


def test_missing_profile_dir_is_one_line(edgesdk_cli, tmp_path) -> None:
    proc = edgesdk_cli("--profiles-dir", str(tmp_path / "nope"), "profiles", "list")
    assert_one_line_error(proc, "nope")


def test_schema_export(edgesdk_cli, tmp_path) -> None:
    proc = edgesdk_cli("schema", "export", str(tmp_path / "schemas"), "--json")
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)
    assert any(f.endswith("bundle-manifest.schema.json") for f in files)


def test_schema_export_onto_a_file_is_one_line(edgesdk_cli, tmp_path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x")
    proc = edgesdk_cli("schema", "export", str(target))
    assert_one_line_error(proc, "file.txt")
