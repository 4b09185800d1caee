"""Small PKI helpers: a CA, serving and client certificates, service-account keys.

Used by the local control plane (API server serving cert, admin client cert) and by the
operator's local-mode webhook (its own CA and serving cert). Files are written with mode 0600
and reused when present, so a restarted ``local up`` keeps its identity.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ensure_ca(directory: Path, name: str = "ca", common_name: str = "fencedlease-ca") -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY * 10)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(key, hashes.SHA256())
    )
    _write(pair.key, _key_pem(key))
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair


def ensure_cert(
    ca: KeyPair,
    directory: Path,
    name: str,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    hosts: tuple[str, ...] = (),
    client: bool = False,
) -> KeyPair:
    """Issue (once) a serving certificate for ``hosts`` or a client certificate."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    ca_key = serialization.load_pem_private_key(ca.key_pem(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem())
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
    )
    if hosts:
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(pair.key, _key_pem(key))
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair


def ensure_rsa_keypair(directory: Path, name: str) -> tuple[Path, Path]:
    """An RSA key pair (service-account token signing): returns (private, public) paths."""
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    if private.exists() and public.exists():
        return private, public
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(private, _key_pem(key))
    _write(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return private, public


@dataclass(frozen=True, slots=True)
class LocalCertificates:
    """Local mode's webhook TLS: its own CA and the serving pair it signed."""

    ca: KeyPair
    serving: KeyPair

    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem()).decode()


def ensure_local_certificates(directory: Path | None, host: str) -> LocalCertificates:
    """Create (once) local mode's webhook CA and the serving pair ``tls.crt``/``tls.key`` for
    ``host`` in ``directory`` (blocking I/O: call it with ``asyncio.to_thread`` from async
    code). The webhook serves with them, the self-registration's ``caBundle`` is the CA."""
    if directory is None:
        raise ValueError("settings.webhook_cert_dir is required for webhook_registration=url")
    ca = ensure_ca(directory, "ca", "fencedlease-webhook-ca")
    hosts = tuple(dict.fromkeys((host, "127.0.0.1", "localhost")))
    serving = ensure_cert(ca, directory, "tls", host, hosts=hosts)
    return LocalCertificates(ca, serving)
