"""Throw-away PKI for the local control plane.

One CA signs the kube-apiserver serving certificate and the admin client
certificate (group ``system:masters``); a separate key pair signs
ServiceAccount tokens.  ECDSA P-256 keeps generation to milliseconds, which
matters because every control plane start makes a fresh set.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Validity of every certificate (days); the control plane is short lived.
VALIDITY_DAYS = 7


@dataclass(frozen=True)
class PkiFiles:
    """PEM files written by :func:`write_pki` (all under one directory)."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_private_key: Path
    sa_public_key: Path


def _key() -> Any:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    return bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _cert(
    subject: x509.Name,
    key: Any,
    issuer: x509.Name,
    issuer_key: Any,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
    validity_days: int = VALIDITY_DAYS,
) -> x509.Certificate:
    # Backdated a minute so small clock differences never make it "not yet valid".
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=validity_days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(directory: Path, *, service_ip: str = "10.0.0.1") -> PkiFiles:
    """Generate the CA, serving, admin and ServiceAccount keys into ``directory``.

    The serving certificate is valid for ``127.0.0.1``, ``localhost``, the
    in-cluster ``kubernetes`` Service names and ``service_ip``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("trainjob-progress-devcluster-ca")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = _key()
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)]
    serving = _cert(_name("kube-apiserver"), serving_key, ca_name, ca_key, ca=False,
                    usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)

    admin_key = _key()
    # Group system:masters is bound to cluster-admin by the bootstrap RBAC policy.
    admin = _cert(_name("devcluster-admin", "system:masters"), admin_key, ca_name, ca_key,
                  ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])

    sa_key = _key()
    files = PkiFiles(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_private_key=directory / "sa.key",
        sa_public_key=directory / "sa.pub",
    )
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca.public_bytes(pem))
    files.ca_key.write_bytes(_key_pem(ca_key))
    files.serving_cert.write_bytes(serving.public_bytes(pem))
    files.serving_key.write_bytes(_key_pem(serving_key))
    files.admin_cert.write_bytes(admin.public_bytes(pem))
    files.admin_key.write_bytes(_key_pem(admin_key))
    files.sa_private_key.write_bytes(_key_pem(sa_key))
    files.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for private in (files.ca_key, files.serving_key, files.admin_key, files.sa_private_key):
        private.chmod(0o600)
    return files


@dataclass(frozen=True)
class ServingPki:
    """A CA and one serving certificate it signed, as PEM bytes (for a webhook server)."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def serving_pki(ca_name: str, dns_names: list[str], ips: list[str], *,
                validity_days: int = VALIDITY_DAYS, rsa_pkcs1: bool = False) -> ServingPki:
    """A fresh CA (``ca_name`` as CN and DNS SAN) and a serving certificate for the names.

    The CA carries its name as a DNS SAN because cert-controller's rotator (used
    by Kubeflow Trainer) verifies the CA against its own name; a rotator also
    replaces certificates that expire within 90 days, so pass a longer
    ``validity_days`` for it, and ``rsa_pkcs1`` (RSA keys in PKCS#1 PEM, the
    only form that rotator parses a CA key in).
    """
    def new_key() -> Any:
        return rsa.generate_private_key(65537, 2048) if rsa_pkcs1 else _key()

    def key_pem(key: Any) -> bytes:
        if not rsa_pkcs1:
            return _key_pem(key)
        return bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))

    ca_key = new_key()
    name = _name(ca_name)
    ca = _cert(name, ca_key, name, ca_key, ca=True, sans=[x509.DNSName(ca_name)],
               validity_days=validity_days)
    key = new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = _cert(_name(dns_names[0] if dns_names else ips[0]), key, name, ca_key, ca=False,
                 usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans,
                 validity_days=validity_days)
    pem = serialization.Encoding.PEM
    return ServingPki(ca_cert=ca.public_bytes(pem), ca_key=key_pem(ca_key),
                      cert=cert.public_bytes(pem), key=key_pem(key))
