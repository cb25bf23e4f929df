"""A throwaway PKI for the local cluster: one CA and serving certificates it signs (``cryptography``).

Everything is written as PEM files into a directory the caller owns (the cluster's temp dir) and is
valid for :data:`VALID_DAYS` days; nothing is trusted system-wide.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALID_DAYS = 2
"""Lifetime of every certificate (days): a test cluster lives for minutes."""


@dataclass(frozen=True)
class KeyPair:
    """Paths of one PEM certificate and its unencrypted PEM private key."""

    cert: Path
    key: Path


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str | x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    name = _name(subject) if isinstance(subject, str) else subject
    return (x509.CertificateBuilder().subject_name(name).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS)))


class CertificateAuthority:
    """A self-signed CA (EC P-256) that signs loopback serving certificates.

    Args:
        directory: where ``ca.crt`` / ``ca.key`` and every issued pair are written.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (_builder("batch-inference-local-ca", _name("batch-inference-local-ca"), self._key.public_key())
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.pair = KeyPair(self.directory / "ca.crt", self.directory / "ca.key")
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.pair.key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM bytes (for kubeconfig ``certificate-authority-data``)."""
        return self.pair.cert.read_bytes()

    def issue_server(self, name: str, dns: list[str], ips: list[str]) -> KeyPair:
        """Sign a serving certificate ``<name>.crt``/``<name>.key`` for the given DNS names and IPs."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (_builder(name, self._cert.subject, key.public_key())
                   .add_extension(x509.SubjectAlternativeName(sans), critical=False))
        return self._sign(name, builder, key, x509.oid.ExtendedKeyUsageOID.SERVER_AUTH)

    def issue_client(self, name: str, user: str, groups: list[str]) -> KeyPair:
        """Sign a client certificate ``<name>.crt``/``<name>.key`` that authenticates as ``user`` (CN) in
        ``groups`` (O), the way the API server and the kubelet read x509 client identities."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user),
                             *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups)])
        builder = _builder(subject, self._cert.subject, key.public_key())
        return self._sign(name, builder, key, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)

    def _sign(self, name: str, builder: x509.CertificateBuilder, key, usage) -> KeyPair:
        cert = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(self._key, hashes.SHA256()))
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """An RSA-2048 key pair for service-account token signing: ``sa.key`` (private), ``sa.pub`` (public,
    in :attr:`KeyPair.cert`). The API server requires both flags even when no token is ever issued."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = KeyPair(Path(directory) / "sa.pub", Path(directory) / "sa.key")
    pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    _write_key(key, pair.key)
    return pair
