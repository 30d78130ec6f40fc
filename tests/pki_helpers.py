"""A small X.509 PKI for MQTT over TLS in tests and benchmarks (no production code uses it).

One CA, one server certificate for ``127.0.0.1``/``localhost``, and one client certificate per
device whose common name is the device id (mosquitto's ``use_identity_as_username`` turns it
into the username the ACL sees). Production fleets use their own CA; this exists so that every
TLS and mTLS path can be exercised end to end without any outside service.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgesdk.errors import KeyFileError

_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class ClientCert:
    """A client certificate and its private key (PEM files)."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class LocalPki:
    """Paths of the generated CA, server certificate and client certificates."""

    ca_file: Path
    ca_key_file: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, ClientCert] = field(default_factory=dict)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def issue_client_cert(pki: LocalPki, out_dir: Path, common_name: str) -> ClientCert:
    """Issue a client certificate with ``common_name`` (the device id) signed by the PKI's CA."""
    ca_key = serialization.load_pem_private_key(pki.ca_key_file.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise KeyFileError(f"{pki.ca_key_file}: the test CA key is {type(ca_key).__name__}, not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ClientCert(
        cert_file=_write_cert(out_dir / f"{common_name}.crt", cert),
        key_file=_write_key(out_dir / f"{common_name}.key", key),
    )


def make_test_pki(out_dir: Path, client_names: list[str] | tuple[str, ...] = ()) -> LocalPki:
    """Create a CA, a server certificate for 127.0.0.1/localhost and one client cert per name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgesdk test CA")])
    ca_cert = (
        _builder("edgesdk test CA", ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        _builder("127.0.0.1", ca_name, server_key.public_key())
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = LocalPki(
        ca_file=_write_cert(out_dir / "ca.crt", ca_cert),
        ca_key_file=_write_key(out_dir / "ca.key", ca_key),
        server_cert=_write_cert(out_dir / "server.crt", server_cert),
        server_key=_write_key(out_dir / "server.key", server_key),
    )
    for name in client_names:
        pki.clients[name] = issue_client_cert(pki, out_dir, name)
    return pki
