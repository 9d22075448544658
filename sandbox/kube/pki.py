"""The cluster's key material, made fresh for each sandbox cluster in its temp dir.

One CA signs the API server's serving certificate (for 127.0.0.1 and the names in-cluster clients
use) and the webhook servers' certificates; a separate RSA key pair signs and verifies service
account tokens, as a real control plane has. Nothing here is reused between runs or leaves the
temp dir.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)
# Names under which clients inside a cluster reach the API server (its certificate must carry them).
_APISERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM private key, written to disk."""

    cert: Path
    key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A throwaway CA whose certificate clients trust (kubeconfig, webhook caBundle)."""

    def __init__(self, directory: Path, name: str = "tpuprov-sandbox-ca") -> None:
        self.directory = directory
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
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
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self.pem)

    @property
    def pem(self) -> bytes:
        """The CA certificate in PEM (what a kubeconfig or a caBundle carries)."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ("127.0.0.1",)) -> CertPair:
        """A serving certificate for ``dns`` names and ``ips``, written as ``<name>.crt``/``.key``."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def apiserver_serving(self, service_ip: str) -> CertPair:
        """The API server's certificate: loopback, the cluster's service IP and in-cluster names."""
        return self.issue("apiserver", dns=_APISERVER_NAMES, ips=("127.0.0.1", service_ip))


def service_account_keys(directory: Path) -> CertPair:
    """The key pair that signs (private) and verifies (public) service account tokens.

    Returned as a ``CertPair`` whose ``cert`` is the PEM public key.
    """
    pair = CertPair(directory / "sa.pub", directory / "sa.key")
    if pair.key.exists() and pair.cert.exists():
        # An API server started again must still accept the tokens issued under this key (the
        # controller manager's controllers hold them).
        return pair
    key = _key()
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
