"""Publisher and device keys: making them, writing them safely, reading them back.

Two kinds of key, never interchangeable:

- a **publisher** key (Ed25519) signs bundle manifests; its public half is what devices
  trust (``trusted_publishers``);
- a **root** key is an Ed25519 key kept offline that signs trust documents
  (:mod:`edgesdk.trust`), which say which publisher and operator keys devices trust;
- a **device** key (X25519) receives bundles: the packager wraps each bundle's content key
  for the device's public key. A *group* key is a device key shared by a group of devices.

Files are PEM (PKCS#8 for private keys, SubjectPublicKeyInfo for public ones), so openssl
and other tools read them. Private keys are written 0600 from the first byte (the file is
created with that mode, never chmod-ed afterwards); reading one that group or others may
read warns with :class:`LooseKeyPermissionsWarning`.

A key id is the first 16 bytes of SHA-256 over the raw 32-byte public key, in hex. Bundles
name publishers and recipients by key id.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from pathlib import Path
from typing import Literal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from edgesdk.errors import KeyFileError

KEY_ID_BYTES = 16
#: Key files are a few hundred bytes; anything much larger is not a key.
MAX_KEY_FILE_BYTES = 16 * 1024

PUBLISHER_PRIVATE = "publisher.key"
PUBLISHER_PUBLIC = "publisher.pub"
DEVICE_PRIVATE = "device.key"
DEVICE_PUBLIC = "device.pub"
ROOT_PRIVATE = "root.key"
ROOT_PUBLIC = "root.pub"

PublicKey = Ed25519PublicKey | X25519PublicKey


class LooseKeyPermissionsWarning(UserWarning):
    """A private key file can be read by users other than its owner."""


def key_id_bytes(public_key: PublicKey) -> bytes:
    """The raw 16-byte key id of a public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:KEY_ID_BYTES]


def key_id(public_key: PublicKey) -> str:
    """The key id of a public key, as 32 hex digits (how bundles and the CLI name keys)."""
    return key_id_bytes(public_key).hex()


def _write_private(path: Path, pem: bytes) -> None:
    # O_EXCL: never overwrite an existing key by accident; mode 0600 at creation, so there is
    # no moment where the key is readable by others.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise KeyFileError(f"{path} already exists; refusing to overwrite a key (move it away first)") from exc
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())


def _write_public(path: Path, pem: bytes) -> None:
    if path.exists():
        raise KeyFileError(f"{path} already exists; refusing to overwrite a key (move it away first)")
    try:
        path.write_bytes(pem)
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from exc


def _pem_private(key: Ed25519PrivateKey | X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_public(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _generate(out_dir: Path | str, kind: Literal["publisher", "root", "device"]) -> tuple[Path, Path]:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(f"cannot create key directory {out}: {exc.strerror or exc}") from exc
    private: Ed25519PrivateKey | X25519PrivateKey
    if kind == "publisher":
        private = Ed25519PrivateKey.generate()
        priv_path, pub_path = out / PUBLISHER_PRIVATE, out / PUBLISHER_PUBLIC
    elif kind == "root":
        private = Ed25519PrivateKey.generate()
        priv_path, pub_path = out / ROOT_PRIVATE, out / ROOT_PUBLIC
    else:
        private = X25519PrivateKey.generate()
        priv_path, pub_path = out / DEVICE_PRIVATE, out / DEVICE_PUBLIC
    if priv_path.exists() or pub_path.exists():
        existing = priv_path if priv_path.exists() else pub_path
        raise KeyFileError(f"{existing} already exists; refusing to overwrite a key (move it away first)")
    _write_private(priv_path, _pem_private(private))
    _write_public(pub_path, _pem_public(private.public_key()))
    return priv_path, pub_path


def generate_publisher_key(out_dir: Path | str) -> tuple[Path, Path]:
    """Make an Ed25519 signing key: ``out_dir/publisher.key`` (0600) and ``publisher.pub``."""
    return _generate(out_dir, "publisher")


def generate_root_key(out_dir: Path | str) -> tuple[Path, Path]:
    """Make an Ed25519 root key: ``out_dir/root.key`` (0600; keep it offline) and ``root.pub``."""
    return _generate(out_dir, "root")


def generate_device_key(out_dir: Path | str) -> tuple[Path, Path]:
    """Make an X25519 device key: ``out_dir/device.key`` (0600) and ``device.pub``."""
    return _generate(out_dir, "device")


def _read_key_file(path: Path | str) -> tuple[Path, bytes]:
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise KeyFileError(f"key file {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"key file {path} is not a regular file")
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is {info.st_size} bytes; a key file is under {MAX_KEY_FILE_BYTES}")
    try:
        return path, path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"key file {path}: {exc.strerror or exc}") from exc


def _describe(key: object) -> str:
    names = {
        Ed25519PrivateKey: "an Ed25519 (publisher) private key",
        Ed25519PublicKey: "an Ed25519 (publisher) public key",
        X25519PrivateKey: "an X25519 (device) private key",
        X25519PublicKey: "an X25519 (device) public key",
    }
    for cls, name in names.items():
        if isinstance(key, cls):
            return name
    return f"a {type(key).__name__.removeprefix('_')}"


def _load_private(path: Path | str) -> tuple[Path, object]:
    file, data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        hint = " (this looks like a public key)" if b"PUBLIC KEY" in data else ""
        raise KeyFileError(f"key file {file} is not an unencrypted PEM private key{hint}") from exc
    _warn_if_readable_by_others(file)
    return file, key


def _warn_if_readable_by_others(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        warnings.warn(
            f"private key {path} has permissions {mode:04o}; other users may read it (fix: chmod 600 {path})",
            LooseKeyPermissionsWarning,
            stacklevel=4,
        )


def _load_public(path: Path | str) -> tuple[Path, object]:
    file, data = _read_key_file(path)
    try:
        return file, serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        hint = " (this looks like a private key; pass the .pub file)" if b"PRIVATE KEY" in data else ""
        raise KeyFileError(f"key file {file} is not a PEM public key{hint}") from exc


def load_publisher_private_key(path: Path | str) -> Ed25519PrivateKey:
    """Read a publisher (Ed25519) signing key; KeyFileError if it is anything else."""
    file, key = _load_private(path)
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"key file {file} holds {_describe(key)}, not a publisher (Ed25519) private key")
    return key


def load_publisher_public_key(path: Path | str) -> Ed25519PublicKey:
    """Read a publisher (Ed25519) public key; KeyFileError if it is anything else."""
    file, key = _load_public(path)
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"key file {file} holds {_describe(key)}, not a publisher (Ed25519) public key")
    return key


def load_device_private_key(path: Path | str) -> X25519PrivateKey:
    """Read a device (X25519) private key; KeyFileError if it is anything else."""
    file, key = _load_private(path)
    if not isinstance(key, X25519PrivateKey):
        raise KeyFileError(f"key file {file} holds {_describe(key)}, not a device (X25519) private key")
    return key


def load_device_public_key(path: Path | str) -> X25519PublicKey:
    """Read a device or group (X25519) public key; KeyFileError if it is anything else."""
    file, key = _load_public(path)
    if not isinstance(key, X25519PublicKey):
        raise KeyFileError(f"key file {file} holds {_describe(key)}, not a device (X25519) public key")
    return key
