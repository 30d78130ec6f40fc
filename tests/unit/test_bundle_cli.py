"""The real ``edgesdk keys|package|bundle`` commands, in subprocesses: the good path, and every
bad bundle of issue 4 as one ``error:`` line naming the problem, a non-zero exit, no output
files."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.bundle_helpers import resign_bundle, write_convert_dir
from tests.conftest import assert_one_line_error


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    """Keys made with the CLI, a convert dir, and a bundle made with the CLI."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("bundle-cli")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True, timeout=120
        )

    for kind, folder in (("publisher", "pub"), ("device", "dev"), ("device", "other"), ("publisher", "stranger")):
        proc = run("keys", kind, "--out", str(root / folder), "--json")
        assert proc.returncode == 0, proc.stderr
    convert = write_convert_dir(
        root / "convert",
        {"onnx-fp32": {"model.onnx": os.urandom(200_000)}},
        golden={"image": np.zeros((2, 1, 8, 8), np.float32)},
    )
    bundle = root / "digits.edgepkg"
    proc = run(
        "package", str(convert), "--name", "digits", "--version", "1.0.0", "--release", "5",
        "--publisher-key", str(root / "pub" / "publisher.key"), "--recipient", str(root / "dev" / "device.pub"),
        "--expires", "30d", "--out", str(bundle), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "bundle": bundle, "convert": convert, "package_json": json.loads(proc.stdout)}


def pub(cli_env, folder: str = "pub") -> str:
    return str(cli_env["root"] / folder / "publisher.pub")


def test_keys_are_written_private(cli_env) -> None:
    key = cli_env["root"] / "dev" / "device.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (cli_env["root"] / "dev" / "device.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_keys_id_matches_the_bundle(cli_env, edgesdk_cli) -> None:
    proc = edgesdk_cli("keys", "id", str(cli_env["root"] / "dev" / "device.pub"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert cli_env["package_json"]["recipients"] == [json.loads(proc.stdout)["key_id"]]


def test_keys_refuse_to_overwrite(cli_env, edgesdk_cli) -> None:
    proc = edgesdk_cli("keys", "device", "--out", str(cli_env["root"] / "dev"))
    assert_one_line_error(proc, "device.key already exists")


def test_package_summary(cli_env) -> None:
    summary = cli_env["package_json"]
    assert (summary["release"], summary["targets"], summary["variants"]) == (5, ["rpi5-8gb"], ["onnx-fp32"])
    assert summary["expires"] is not None


def test_inspect_says_unverified(cli_env, edgesdk_cli) -> None:
    proc = edgesdk_cli("bundle", "inspect", str(cli_env["bundle"]), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verified"] is False and data["manifest"]["model"]["release"] == 5
    table = edgesdk_cli("bundle", "inspect", str(cli_env["bundle"]))
    assert "NOT CHECKED" in table.stdout


def test_verify_with_device_key_decrypts_in_memory(cli_env, edgesdk_cli, tmp_path) -> None:
    before = set(cli_env["root"].rglob("*"))
    proc = edgesdk_cli(
        "bundle", "verify", str(cli_env["bundle"]), "--publisher-pub", pub(cli_env),
        "--device-key", str(cli_env["root"] / "dev" / "device.key"), "--profile", "rpi5-8gb",
        "--installed-release", "4", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verified"] is True
    assert data["decrypted"]["onnx-fp32"].startswith("ok (1 file(s), 200000 bytes)")
    assert "anti-rollback" in data["checks"] and "target profile" in data["checks"]
    assert set(cli_env["root"].rglob("*")) == before  # nothing written


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x04
    path.write_bytes(bytes(data))


def _case_bundle(case: str, cli_env, tmp_path: Path) -> Path:
    path = Path(shutil.copyfile(cli_env["bundle"], tmp_path / f"{case}.edgepkg"))
    size = path.stat().st_size
    if case == "tampered-manifest":
        path.write_bytes(path.read_bytes().replace(b'"release":5', b'"release":6', 1))
    elif case == "flipped-payload":
        _flip(path, size - 300)
    elif case == "flipped-signature":
        from edgesdk.bundle import inspect_bundle

        _flip(path, 48 + inspect_bundle(path).header.manifest_length + 30)
    elif case == "truncated":
        path.write_bytes(path.read_bytes()[: size // 2])
    elif case == "traversal":
        from edgesdk.keys import load_publisher_private_key

        signer = load_publisher_private_key(cli_env["root"] / "pub" / "publisher.key")
        resign_bundle(cli_env["bundle"], path, signer, lambda m: m["variants"][0]["files"][0].update(name="../../x"))
    elif case == "larger-than-declared":
        from edgesdk.keys import load_publisher_private_key

        def shrink(m: dict) -> None:
            m["variants"][0]["size"] = 10
            m["variants"][0]["files"][0]["size"] = 10

        signer = load_publisher_private_key(cli_env["root"] / "pub" / "publisher.key")
        resign_bundle(cli_env["bundle"], path, signer, shrink)
    return path


# case, extra CLI arguments, needles of the one error line
BAD_BUNDLES = [
    ("tampered-manifest", [], ["signature does not verify"]),
    ("flipped-payload", [], ["payload 'golden.npz.enc' does not match its signed SHA-256"]),
    ("flipped-signature", [], ["signature does not verify"]),
    ("truncated", [], ["truncated"]),
    ("wrong-device-key", ["--device-key", "other/device.key"], ["not encrypted for device key"]),
    ("unknown-publisher", ["--stranger"], ["signed by unknown publisher key"]),
    ("older-release", ["--installed-release", "5"], ["release 5 is not newer than the installed release 5"]),
    ("other-profile", ["--profile", "jetson-nano"], ["not this device's profile 'jetson-nano'"]),
    ("traversal", [], ["files.0.name", "../../x"]),
    ("larger-than-declared", [], ["10 plaintext bytes encrypt to 26"]),
]


@pytest.mark.parametrize(("case", "extra", "needles"), BAD_BUNDLES, ids=[c[0] for c in BAD_BUNDLES])
def test_bad_bundles_are_one_line_errors(cli_env, edgesdk_cli, tmp_path, case, extra, needles) -> None:
    path = _case_bundle(case, cli_env, tmp_path)
    publisher = pub(cli_env, "stranger") if "--stranger" in extra else pub(cli_env)
    args = [a if not a.endswith(".key") else str(cli_env["root"] / a) for a in extra if a != "--stranger"]
    before = set(tmp_path.iterdir())
    proc = edgesdk_cli("bundle", "verify", str(path), "--publisher-pub", publisher, *args)
    assert_one_line_error(proc, *needles)
    assert proc.stdout == ""
    assert set(tmp_path.iterdir()) == before


def test_expired_bundle(cli_env, edgesdk_cli, tmp_path) -> None:
    # Packaged with an expiry in the past is refused up front; one that expires an hour from
    # "now" is verified; its expiry is checked against the device clock (see the unit tests).
    proc = edgesdk_cli(
        "package", str(cli_env["convert"]), "--name", "digits", "--version", "1.0.0",
        "--publisher-key", str(cli_env["root"] / "pub" / "publisher.key"),
        "--recipient", str(cli_env["root"] / "dev" / "device.pub"),
        "--expires", "2020-01-01", "--out", str(tmp_path / "old.edgepkg"),
    )  # fmt: skip
    assert_one_line_error(proc, "expiry 2020-01-01T00:00:00+00:00 is not in the future")
    assert not (tmp_path / "old.edgepkg").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--version", "1.0"], ["field 'version'", "'1.0'"]),
        (["--target", "rpi9"], ["profile 'rpi9' not found", "known:"]),
        (["--expires", "soon"], ["--expires 'soon' is not a duration"]),
        (["--publisher-key", "dev/device.key"], ["X25519 (device) private key, not a publisher"]),
        (["--recipient", "pub/publisher.pub"], ["Ed25519 (publisher) public key, not a device"]),
    ],
)
def test_package_bad_arguments(cli_env, edgesdk_cli, tmp_path, args, needles) -> None:
    base = {
        "--name": "digits",
        "--version": "1.0.0",
        "--publisher-key": "pub/publisher.key",
        "--recipient": "dev/device.pub",
        "--out": str(tmp_path / "x.edgepkg"),
    }
    overrides = dict(zip(args[::2], args[1::2]))
    merged = base | overrides
    argv = ["package", str(cli_env["convert"])]
    for option, value in merged.items():
        if value.endswith((".key", ".pub")):
            value = str(cli_env["root"] / value)
        argv += [option, value]
    proc = edgesdk_cli(*argv)
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "x.edgepkg").exists()


def test_verify_needs_a_publisher_key(cli_env, edgesdk_cli) -> None:
    proc = edgesdk_cli("bundle", "verify", str(cli_env["bundle"]))
    assert_one_line_error(proc, "--publisher-pub")
