"""The plant CA: a self-signed root and one certificate per box, the box's roles in SAN URIs.

Pure crypto (the `cryptography` library), no gRPC: the CLI (`edgeinspect certs`), the embedded launcher
(`up --tls`) and the deployment renderer all issue through here, and the servers read a peer's roles back with
`roles_of`. It lives at the package root beside codec.py because none of those callers is a server role.

A certificate names its roles as `edgeinspect://role/<role>` URIs; every certificate can serve and call
(serverAuth + clientAuth), since a box is a server to its callers and a client of the next hop.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLE_URI_PREFIX = "edgeinspect://role/"
ROLES = ("gateway", "vision", "retrieval", "stage", "ingest", "console", "operator")
CA_CERT, CA_KEY = "ca.crt", "ca.key"
DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 825  # what browsers and most plant IT policies still accept for a leaf


@dataclass(frozen=True)
class Issued:
    """PEM bytes of one certificate and its private key."""

    cert: bytes
    key: bytes


@dataclass(frozen=True)
class CertPaths:
    """Where a role finds its certificate, its key and the CA that signed its peers."""

    cert: Path
    key: Path
    ca: Path


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(name: str = "edgeinspect plant CA", days: int = DEFAULT_CA_DAYS) -> Issued:
    """A new self-signed CA (EC P-256) that may sign box certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate a box clock a few minutes behind
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign + cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(_cert_pem(cert), _key_pem(key))


def issue(
    ca: Issued,
    name: str,
    roles: list[str],
    hosts: Sequence[str] = (),
    ips: Sequence[str] = (),
    days: int = DEFAULT_CERT_DAYS,
) -> Issued:
    """A box certificate signed by `ca`: CN `name`, SANs = DNS `name` + `hosts`, IPs `ips`, one URI per role."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise ValueError(f"roles must be some of {', '.join(ROLES)}; got {roles or 'none'}")
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(h) for h in dict.fromkeys([name, *hosts])]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(ips)]
    sans += [x509.UniformResourceIdentifier(ROLE_URI_PREFIX + r) for r in dict.fromkeys(roles)]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(_cert_pem(cert), _key_pem(key))


def roles_of(cert_pem: bytes) -> list[str]:
    """The roles a certificate carries (its `edgeinspect://role/...` SAN URIs); [] when it has none."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    return [u.removeprefix(ROLE_URI_PREFIX) for u in uris if u.startswith(ROLE_URI_PREFIX)]


def days_left(cert_pem: bytes) -> float:
    """Days until the certificate expires (negative: expired)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return (cert.not_valid_after_utc - _now()).total_seconds() / 86400


def subject_name(cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else cert.subject.rfc4514_string()


def write_secret(path: Path, data: bytes) -> None:
    """Writes a private key (or any secret) readable by its owner only, never world-readable even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # O_CREAT's mode applies only to a new file


def write_ca(out: Path, ca: Issued) -> CertPaths:
    out.mkdir(parents=True, exist_ok=True)
    (out / CA_CERT).write_bytes(ca.cert)
    write_secret(out / CA_KEY, ca.key)
    return CertPaths(out / CA_CERT, out / CA_KEY, out / CA_CERT)


def load_ca(ca_dir: Path) -> Issued:
    cert, key = ca_dir / CA_CERT, ca_dir / CA_KEY
    if not cert.is_file() or not key.is_file():
        raise FileNotFoundError(f"no CA in {ca_dir}: run `edgeinspect certs init --out {ca_dir}` first")
    return Issued(cert.read_bytes(), key.read_bytes())


def write_issued(out: Path, name: str, issued: Issued, ca_cert: Path) -> CertPaths:
    """`out/<name>.crt` (0644) and `out/<name>.key` (0600); the CA certificate path is passed through."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.crt").write_bytes(issued.cert)
    write_secret(out / f"{name}.key", issued.key)
    return CertPaths(out / f"{name}.crt", out / f"{name}.key", ca_cert)


def ensure_ca(ca_dir: Path) -> Issued:
    """The CA in `ca_dir`, made on first use (the embedded stack keeps one per workdir)."""
    if not (ca_dir / CA_CERT).is_file():
        write_ca(ca_dir, make_ca())
    return load_ca(ca_dir)
