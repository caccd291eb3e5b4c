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

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Validity of every certificate (days); the control plane is short lived.
VALIDITY_DAYS = 7


@dataclass(frozen=True)
class PkiFiles:
    """PEM files written by :func:`write_pki` (all under one directory)."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_private_key: Path
    sa_public_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
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
        .not_valid_after(now + dt.timedelta(days=VALIDITY_DAYS))
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
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_private_key=directory / "sa.key",
        sa_public_key=directory / "sa.pub",
    )
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca.public_bytes(pem))
    files.serving_cert.write_bytes(serving.public_bytes(pem))
    files.serving_key.write_bytes(_key_pem(serving_key))
    files.admin_cert.write_bytes(admin.public_bytes(pem))
    files.admin_key.write_bytes(_key_pem(admin_key))
    files.sa_private_key.write_bytes(_key_pem(sa_key))
    files.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for private in (files.serving_key, files.admin_key, files.sa_private_key):
        private.chmod(0o600)
    return files
