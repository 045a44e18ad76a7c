"""Certificates made per run, as envtest makes them: a CA that signs the API server's serving
certificate, the clients' certificates (``CN`` = user, ``O`` = groups) and the webhook servers'
serving certificates; and the service-account signing key pair. ECDSA P-256: quick to make."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its key, PEM; ``write()`` puts them in files."""

    cert: bytes
    key: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """``<name>.crt`` and ``<name>.key`` in ``directory``; returns their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        crt, key = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(self.cert)
        key.write_bytes(self.key)
        key.chmod(0o600)
        return crt, key


class CertificateAuthority:
    """A self-signed CA for one control plane (or one webhook server)."""

    def __init__(self, name: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._name = subject
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Iterable[str] = (),
        hosts: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """A leaf certificate: ``hosts`` (DNS names or IP addresses) as its SANs."""
        now = datetime.datetime.now(datetime.UTC)
        key = _key()
        names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        names.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ] * client
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(names))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def signing_key_pair() -> tuple[bytes, bytes]:
    """(private, public) PEM of a service-account token signing key (ES256)."""
    key = _key()
    return key_pem(key), public_pem(key)
