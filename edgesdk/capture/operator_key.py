"""The operator's capture key: an X25519 pair (PEM, as device keys are). ``capture.pub`` goes in
the agents' ``[capture] operator_public_key``; ``capture.key`` stays with whoever may read the
captured data (never on a device, never on the fleet service)."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.errors import KeyFileError

CAPTURE_PRIVATE = "capture.key"
CAPTURE_PUBLIC = "capture.pub"


def generate_capture_key(out_dir: Path | str) -> tuple[Path, Path]:
    """``out_dir/capture.key`` (0600 from its first byte) and ``capture.pub``; never overwrites."""
    out = Path(out_dir)
    private_path, public_path = out / CAPTURE_PRIVATE, out / CAPTURE_PUBLIC
    for path in (private_path, public_path):
        if path.exists():
            raise KeyFileError(f"{path} already exists; refusing to overwrite a key (move it away first)")
    key = X25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private_pem)
        public_path.write_bytes(public_pem)
    except OSError as exc:
        raise KeyFileError(f"cannot write the capture key in {out}: {exc.strerror or exc}") from exc
    return private_path, public_path
