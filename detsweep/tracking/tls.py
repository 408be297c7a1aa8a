"""The head's certificate, made at ``ray up``: a certificate authority of the cluster's own
signs the MLflow server's certificate for the head's addresses, and its key is thrown away.

Clients trust the authority's certificate (``MLFLOW_TRACKING_SERVER_CERT_PATH``), which is
public: ``ray_cluster.yaml`` writes it into the head's copy of the checkout, which every
worker node's copy is made from. The server's key stays in the head's MLflow folder (0600).
Made again only when the head's addresses are no longer all in the certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from .credentials import write_file

SERVER_KEY, SERVER_CERT = "server.key", "server.crt"
VALID = datetime.timedelta(days=825)


def addresses() -> list[str]:
    """This machine's IPv4 addresses, loopback included, and ``localhost`` (an SSH tunnel's end)."""
    import socket

    import psutil

    found = {address.address for interface in psutil.net_if_addrs().values() for address in interface
             if address.family == socket.AF_INET}
    return sorted(found | {"127.0.0.1"}) + ["localhost"]


def ensure_certificate(folder: Path, authority: Path, hosts: list[str]) -> bool:
    """The server's key and certificate in ``folder`` for ``hosts``, signed by a new authority
    whose certificate goes to ``authority``; kept if they still fit (``_still_good``). True if made."""
    if _still_good(folder, authority, hosts):
        return False
    from cryptography.hazmat.primitives.asymmetric import ec

    authority_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    authority_cert = _certificate("detsweep cluster CA", authority_key.public_key(), authority_key, None, hosts=None)
    server_cert = _certificate("detsweep MLflow server", server_key.public_key(), authority_key, authority_cert, hosts)
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / SERVER_KEY, _pem_key(server_key), 0o600)
    write_file(folder / SERVER_CERT, _pem(server_cert), 0o644)
    authority.parent.mkdir(parents=True, exist_ok=True)
    write_file(authority, _pem(authority_cert), 0o644)
    return True


def _certificate(name: str, public_key, signer, issuer_cert, hosts: list[str] | None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + VALID)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))
    if hosts is None:  # the authority: signs certificates, nothing else
        signs = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                              encipher_only=False, decipher_only=False)
        builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(signs, critical=True))
    else:
        builder = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False))
    return builder.sign(signer, hashes.SHA256())


def _general_name(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _still_good(folder: Path, authority: Path, hosts: list[str]) -> bool:
    """The key, the certificate and the authority's all there, the certificate signed by that
    authority (a set-up cut part-way, or an authority copied over the head's, is not),
    unexpired, and naming every one of ``hosts``."""
    from cryptography import x509

    if not all(path.exists() for path in (folder / SERVER_KEY, folder / SERVER_CERT, authority)):
        return False
    server = x509.load_pem_x509_certificate((folder / SERVER_CERT).read_bytes())
    try:
        server.verify_directly_issued_by(x509.load_pem_x509_certificate(authority.read_bytes()))
    except (ValueError, TypeError, InvalidSignature):
        return False
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)
    return set(hosts) <= named and server.not_valid_after_utc > soon


def _pem(cert) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return cert.public_bytes(Encoding.PEM)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


