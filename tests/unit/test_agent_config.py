"""Agent config: TOML file + EDGESDK_AGENT__* overrides → one validated AgentConfig or one ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgesdk.agent.config import env_overrides, load_config

from edgesdk.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_file_values_and_relative_paths(tmp_path) -> None:
    path = write(
        tmp_path,
        'device_id = "pi-7"\nprofile = "rpi5-8gb"\ndata_dir = "state"\npublisher_keys = ["keys/pub.pem"]\n'
        '[api]\nport = 0\nunix_socket = "/run/edge.sock"\n[governor]\nsource = "trace"\ntrace_file = "t.jsonl"\n',
    )
    config = load_config(path, environ={})
    assert config.device_id == "pi-7"
    assert config.data_dir == tmp_path / "state"
    assert config.publisher_keys == [tmp_path / "keys" / "pub.pem"]
    assert config.api.unix_socket == Path("/run/edge.sock")
    assert config.governor.trace_file == tmp_path / "t.jsonl"


def test_environment_overrides_file(tmp_path) -> None:
    path = write(tmp_path, 'device_id = "pi-7"\nprofile = "rpi5-8gb"\n[api]\nport = 8000\n')
    env = {
        "EDGESDK_AGENT__API__PORT": "9000",
        "EDGESDK_AGENT__API__ALLOW_NONFINITE": "true",
        "EDGESDK_AGENT__MQTT__GROUPS": '["lab", "north"]',
        "EDGESDK_AGENT__PROFILE": "jetson-orin-nano-8gb",
        "UNRELATED": "x",
    }
    config = load_config(path, environ=env)
    assert config.api.port == 9000
    assert config.api.allow_nonfinite is True
    assert config.mqtt.groups == ["lab", "north"]
    assert config.profile == "jetson-orin-nano-8gb"


def test_environment_alone_is_enough() -> None:
    config = load_config(None, environ={"EDGESDK_AGENT__DEVICE_ID": "d1", "EDGESDK_AGENT__PROFILE": "rpi4-4gb"})
    assert (config.device_id, config.profile) == ("d1", "rpi4-4gb")


def test_env_override_tree() -> None:
    assert env_overrides({"EDGESDK_AGENT__A__B": "1", "EDGESDK_AGENT__A__C": "x y"}) == {"a": {"b": 1, "c": "x y"}}
    with pytest.raises(ConfigError, match="empty key part"):
        env_overrides({"EDGESDK_AGENT__A____B": "1"})
    with pytest.raises(ConfigError, match="is a value"):
        env_overrides({"EDGESDK_AGENT__A": "1", "EDGESDK_AGENT__A__B": "2"})


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ('device_id = "d"\n', {}, "profile"),
        ('device_id = "d"\nprofile = "p"\ntypo = 1\n', {}, "typo"),
        ('device_id = "bad id!"\nprofile = "p"\n', {}, "device_id"),
        ('device_id = "d"\nprofile = "p"\n[api]\nport = 70000\n', {}, "api.port"),
        ('device_id = "d"\nprofile = "p"\n', {"EDGESDK_AGENT__API__MAX_CONCURRENCY": "0"}, "max_concurrency"),
        ("device_id = \n", {}, "not valid TOML"),
    ],
)
def test_bad_config_is_one_config_error(tmp_path, text, env, needle) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        load_config(write(tmp_path, text), environ=env)
    assert "\n" not in str(info.value)


def test_missing_and_unreadable_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml", environ={})
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "bin.toml", environ={})
