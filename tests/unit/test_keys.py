from __future__ import annotations

import os
import re
import stat
import warnings

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from edgesdk.errors import KeyFileError
from edgesdk.keys import (
    LooseKeyPermissionsWarning,
    generate_device_key,
    generate_publisher_key,
    key_id,
    load_device_private_key,
    load_device_public_key,
    load_publisher_private_key,
    load_publisher_public_key,
)


def test_publisher_key_pair_round_trips(tmp_path) -> None:
    priv, pub = generate_publisher_key(tmp_path)
    assert (priv.name, pub.name) == ("publisher.key", "publisher.pub")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    private = load_publisher_private_key(priv)
    public = load_publisher_public_key(pub)
    assert isinstance(private, Ed25519PrivateKey) and isinstance(public, Ed25519PublicKey)
    assert key_id(private.public_key()) == key_id(public)
    public.verify(private.sign(b"m"), b"m")


def test_device_key_pair_round_trips(tmp_path) -> None:
    priv, pub = generate_device_key(tmp_path / "dev")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    private = load_device_private_key(priv)
    public = load_device_public_key(pub)
    assert isinstance(private, X25519PrivateKey) and isinstance(public, X25519PublicKey)
    assert key_id(private.public_key()) == key_id(public)
    assert len(key_id(public)) == 32 and int(key_id(public), 16) >= 0


def test_two_keys_have_different_ids(tmp_path) -> None:
    _, a = generate_device_key(tmp_path / "a")
    _, b = generate_device_key(tmp_path / "b")
    assert key_id(load_device_public_key(a)) != key_id(load_device_public_key(b))


def test_refuses_to_overwrite_a_key(tmp_path) -> None:
    priv, _ = generate_publisher_key(tmp_path)
    before = priv.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        generate_publisher_key(tmp_path)
    assert priv.read_bytes() == before


def test_loose_permissions_warn(tmp_path) -> None:
    priv, _ = generate_device_key(tmp_path)
    os.chmod(priv, 0o644)
    with pytest.warns(LooseKeyPermissionsWarning, match="0644.*chmod 600"):
        load_device_private_key(priv)


def test_tight_permissions_do_not_warn(tmp_path) -> None:
    priv, _ = generate_device_key(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_device_private_key(priv)


@pytest.mark.parametrize(
    ("make", "load", "needle"),
    [
        (generate_device_key, load_publisher_private_key, "X25519 (device) private key, not a publisher"),
        (generate_publisher_key, load_device_private_key, "Ed25519 (publisher) private key, not a device"),
    ],
)
def test_wrong_kind_of_private_key_is_named(tmp_path, make, load, needle) -> None:
    priv, _ = make(tmp_path)
    with pytest.raises(KeyFileError, match=re.escape(needle)):
        load(priv)


def test_public_key_where_private_expected(tmp_path) -> None:
    _, pub = generate_device_key(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a public key is 0644 by design: no permissions warning
        with pytest.raises(KeyFileError, match="looks like a public key"):
            load_device_private_key(pub)


def test_private_key_where_public_expected(tmp_path) -> None:
    priv, _ = generate_publisher_key(tmp_path)
    with pytest.raises(KeyFileError, match="pass the .pub file"):
        load_publisher_public_key(priv)


def test_device_public_key_is_not_a_publisher_key(tmp_path) -> None:
    _, pub = generate_device_key(tmp_path)
    with pytest.raises(KeyFileError, match="not a publisher"):
        load_publisher_public_key(pub)


def test_missing_and_garbage_files(tmp_path) -> None:
    with pytest.raises(KeyFileError, match="nope.pub"):
        load_device_public_key(tmp_path / "nope.pub")
    garbage = tmp_path / "garbage.pub"
    garbage.write_bytes(b"hello")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_device_public_key(garbage)
    huge = tmp_path / "huge.pub"
    huge.write_bytes(b"x" * 100_000)
    with pytest.raises(KeyFileError, match="100000 bytes"):
        load_device_public_key(huge)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_device_public_key(tmp_path)
