"""A throwaway certificate authority for a fleet on one machine (`warmfleet up --tls`) and
for tests: a CA and one certificate for every component, written in cert-manager's
Secret layout (`ca.crt`, `tls.crt`, `tls.key`). Built with the `cryptography` package:
ECDSA P-256 keys, SHA-256 signatures, the certificate valid for the host names and
addresses given and for both server and client authentication (each component serves
with it and presents it to the others), 30 days. Nothing here is meant to outlive the
fleet it was made for.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class CertFiles:
    """A certificate, its key and the CA that signed it (cert-manager's names)."""

    cert: Path
    key: Path
    ca: Path


def make_local_ca(
    directory: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1"), name: str = "warmfleet"
) -> CertFiles:
    """A new CA in `directory` and a certificate for `hosts` signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.crt"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(directory / "ca.key", _pem(ca_key))  # to issue more (renewals, nodes)
    return issue(directory, ca_cert, ca_key, hosts, name, ca_path)


def issue_from(
    ca: Path, directory: Path, hosts: Sequence[str], name: str = "warmfleet"
) -> CertFiles:
    """Another certificate from the CA whose `ca.crt` is `ca` (its `ca.key` beside it):
    a renewal, or one for another host."""
    ca_cert = x509.load_pem_x509_certificate(ca.read_bytes())
    ca_key = serialization.load_pem_private_key((ca.parent / "ca.key").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.parent / 'ca.key'} is not this module's kind of key")
    directory.mkdir(parents=True, exist_ok=True)
    return issue(directory, ca_cert, ca_key, hosts, name, ca)


def issue(
    directory: Path,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str],
    name: str,
    ca_path: Path,
    *,
    prefix: str = "tls",
) -> CertFiles:
    """A certificate for `hosts` signed by the CA, as `<prefix>.crt` and `<prefix>.key`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{prefix}.crt", directory / f"{prefix}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, _pem(key))
    return CertFiles(cert_path, key_path, ca_path)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
