"""Provisioning image inputs: config rendering, broker URLs, profiles the agent cannot run on."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from edgesdk.errors import ImageError
from edgesdk.image import toml_writer
from edgesdk.image.agent_config import ProvisioningConfig, check_broker_url, fill_placeholders, render_agent_config
from edgesdk.image.builder import ImageOptions, check_options
from edgesdk.image.recipes import recipe_for
from edgesdk.image.wheelhouse import device_python, download_args
from edgesdk.profiles import get_profile
from edgesdk.schemas.agent_config import AgentConfig
from tests.conftest import assert_one_line_error


def load_config(text: str, *, device_id: str = "dev-1", root: str = "") -> AgentConfig:
    return AgentConfig.model_validate(tomllib.loads(fill_placeholders(text, device_id=device_id, root=root)))


def test_rendered_config_is_valid_toml_and_a_valid_agent_config() -> None:
    text = render_agent_config(
        ProvisioningConfig(
            profile="rpi5-8gb",
            broker="mqtts://broker.example:8883",
            has_ca=True,
            publisher_key_names=["acme.pub"],
            groups=["line-1", "canary"],
            api_port=9100,
        )
    )
    assert "@DEVICE_ID@" in text and "@ROOT@" in text
    config = load_config(text, device_id="cam-07")
    assert config.device_id == "cam-07"
    assert config.profile == "rpi5-8gb"
    assert config.mqtt.enabled and config.mqtt.broker == "mqtts://broker.example:8883"
    assert config.mqtt.groups == ["line-1", "canary"]
    assert config.mqtt.tls is not None and str(config.mqtt.tls.ca_file) == "/etc/edgesdk/ca.pem"
    assert [str(p) for p in config.publisher_keys] == ["/etc/edgesdk/publishers/acme.pub"]
    assert config.api.port == 9100 and config.api.host == "127.0.0.1"
    assert config.device_key is None  # the agent makes data_dir/device.key on first start


def test_a_shipped_trust_document_is_what_the_config_points_at() -> None:
    text = render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtt://b", has_trust_document=True))
    assert str(load_config(text).trust_document) == "/etc/edgesdk/trust.json"
    without = render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtt://b"))
    assert load_config(without).trust_document is None


def test_root_prefix_moves_every_path_and_nothing_else() -> None:
    text = render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtt://10.0.0.2"))
    config = load_config(text, root="/tmp/stage")
    for path in (config.data_dir, config.api.unix_socket):
        assert str(path).startswith("/tmp/stage/"), path
    assert config.mqtt.broker == "mqtt://10.0.0.2" and config.mqtt.tls is None


def test_mqtts_without_ca_uses_tls_with_the_system_store() -> None:
    config = load_config(render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtts://b.example")))
    assert config.mqtt.tls is not None and config.mqtt.tls.ca_file is None


def test_invalid_setting_fails_at_build_time_naming_the_field() -> None:
    with pytest.raises(ImageError, match="namespace"):
        render_agent_config(ProvisioningConfig(profile="rpi5-8gb", broker="mqtt://b", namespace="bad ns!"))


@pytest.mark.parametrize(
    "url",
    ["mqtt://broker.local", "mqtts://broker.local:8883", "mqtt://127.0.0.1:1883", "mqtt://[::1]:1883/"],
)
def test_good_broker_urls(url: str) -> None:
    assert check_broker_url(url) == url.rstrip("/")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://broker.local", "scheme 'http'"),
        ("broker.local:1883", "mqtt://HOST"),
        ("mqtt://", "no host"),
        ("mqtt://b.local:99999", "invalid"),
        ("mqtt://b.local:0", "port 0"),
        ("mqtt://user:pw@b.local", "credentials"),
        ("mqtt://b.local/topic", "path"),
    ],
)
def test_bad_broker_urls_name_the_url(url: str, needle: str) -> None:
    with pytest.raises(ImageError, match="broker URL") as info:
        check_broker_url(url)
    assert needle in str(info.value) and repr(url) in str(info.value)


def test_toml_writer_escapes_and_nests() -> None:
    text = toml_writer.dumps(
        {"a": 'quote " and \\ and é', "n": 1.5, "flag": False, "skip": None, "t": {"x": [1, 2], "u": {"y": "z"}}},
        header="line one",
    )
    assert text.startswith("# line one\n")
    assert tomllib.loads(text) == {
        "a": 'quote " and \\ and é',
        "n": 1.5,
        "flag": False,
        "t": {"x": [1, 2], "u": {"y": "z"}},
    }


def test_toml_writer_refuses_what_toml_cannot_say() -> None:
    with pytest.raises(ValueError, match="finite"):
        toml_writer.dumps({"x": float("nan")})
    with pytest.raises(TypeError, match="object"):
        toml_writer.dumps({"x": object()})


@pytest.mark.parametrize(("name", "version"), [("jetson-nano", "3.6"), ("coral-dev-board", "3.7")])
def test_profiles_with_too_old_python_are_refused_naming_the_version(name: str, version: str) -> None:
    with pytest.raises(ImageError) as info:
        device_python(get_profile(name))
    message = str(info.value)
    assert f"Python {version}" in message and ">= 3.10" in message and repr(name) in message


def test_profile_without_python_is_refused() -> None:
    with pytest.raises(ImageError, match="no system Python"):
        device_python(get_profile("iphone-15-pro"))


def test_download_args_pass_every_platform_tag_and_the_device_python() -> None:
    profile = get_profile("rpi5-8gb")
    args = download_args(profile, device_python(profile))
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert tags == profile.platform.wheel_platforms and "manylinux2014_aarch64" in tags
    assert args[args.index("--python-version") + 1] == "3.11"
    assert "--only-binary=:all:" in args and args[args.index("--implementation") + 1] == "cp"


@pytest.mark.parametrize(
    ("profile", "family"),
    [
        ("rpi5-8gb", "raspberry-pi-os-arm64"),
        ("jetson-orin-nano-8gb", "jetson-l4t"),
        ("intel-nuc-core-ultra", "debian-x86_64"),
    ],
)
def test_profiles_find_their_family(profile: str, family: str) -> None:
    assert recipe_for(get_profile(profile)).family == family


def test_family_for_another_arch_is_refused() -> None:
    with pytest.raises(ImageError, match="is for x86_64"):
        recipe_for(get_profile("rpi5-8gb"), "debian-x86_64")
    with pytest.raises(ImageError, match="known: "):
        recipe_for(get_profile("rpi5-8gb"), "yocto")


def test_profile_no_family_fits_lists_families() -> None:
    with pytest.raises(ImageError, match="--family"):
        recipe_for(get_profile("rk3588-orangepi5"))


def _options(tmp_path: Path, **changes: object) -> ImageOptions:
    values: dict[str, object] = {
        "profile": get_profile("rpi5-8gb"),
        "broker": "mqtt://b.local",
        "out": tmp_path / "image.tar.gz",
    }
    values.update(changes)
    return ImageOptions(**values)  # type: ignore[arg-type]


def test_check_options_catches_bad_files_before_any_slow_step(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello")
    bundle = tmp_path / "m.edgepkg"
    bundle.write_bytes(b"x")
    cases = [
        (_options(tmp_path, bundle=tmp_path / "missing.edgepkg"), "missing.edgepkg"),
        (_options(tmp_path, ca=not_pem, broker="mqtts://b"), "not a PEM"),
        (_options(tmp_path, bundle=bundle), "--publisher-key"),
        (_options(tmp_path, out=tmp_path / "image.zip"), ".tar.gz"),
        (_options(tmp_path, out=tmp_path / "nowhere" / "i.tar.gz"), "does not exist"),
        (_options(tmp_path, extras=["torch"]), "'torch'"),
        (_options(tmp_path, groups=["line/1"]), "'line/1'"),
        (_options(tmp_path, agent_wheel=bundle), "edgesdk-*.whl"),
    ]
    for options, needle in cases:
        with pytest.raises(ImageError) as info:
            check_options(options)
        assert needle in str(info.value)


def test_ca_with_plain_mqtt_is_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    with pytest.raises(ImageError, match="mqtts://"):
        check_options(_options(tmp_path, ca=ca))


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--profile", "rpi9", "--broker", "mqtt://b"], ["'rpi9'", "known:"]),
        (["--profile", "rpi5-8gb", "--broker", "http://b"], ["broker URL", "'http://b'"]),
        (["--profile", "jetson-nano", "--broker", "mqtt://b"], ["Python 3.6", "'jetson-nano'"]),
        (["--profile", "coral-dev-board", "--broker", "mqtt://b"], ["Python 3.7"]),
        (["--profile", "rpi5-8gb", "--broker", "mqtt://b", "--bundle", "nope.edgepkg"], ["'nope.edgepkg'"]),
    ],
)
def test_cli_bad_input_is_one_line(edgesdk_cli, tmp_path: Path, args: list[str], needles: list[str]) -> None:
    proc = edgesdk_cli("image", "build", *args, "--out", str(tmp_path / "i.tar.gz"))
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "i.tar.gz").exists()
