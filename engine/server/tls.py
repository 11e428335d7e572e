"""Serving beyond this machine: what a network bind needs (a strong token and TLS), and the certificates.

Used by ``volsynth serve``: ``check_bind`` refuses an unsafe bind; ``self_signed_certificate`` makes (and
reuses) the certificate whose fingerprint clients pin.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
from pathlib import Path

from engine import wire
from engine.errors import InvalidRequest
from engine.server.auth import MIN_TOKEN_CHARS, TOKEN_BYTES, check_token


def check_bind(host: str, token: str | None, tls: bool, allow_plain_http: bool = False) -> None:
    """Refuse a weak token anywhere, and a network bind without a token and TLS (``InvalidRequest`` saying
    what to do)."""
    if token:
        check_token(token)
    if wire.is_loopback(host):
        return
    if not token:
        raise InvalidRequest(
            f"serving on {host} (beyond this machine) needs a token: volumes may hold patient data. "
            "Make one with `volsynth serve --new-token` and pass it as --token or $VOLSYNTH_SERVER_TOKEN"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidRequest(
            f"a token for a network bind needs at least {TOKEN_BYTES} random bytes ({MIN_TOKEN_CHARS}+ "
            f"characters), this one has {len(token)} characters; make one with `volsynth serve --new-token`"
        )
    if not tls and not allow_plain_http:
        raise InvalidRequest(
            f"serving on {host} without TLS sends the token and volumes in clear; add --tls-self-signed "
            "(or --tls-cert and --tls-key), or --allow-plain-http behind a TLS-terminating proxy"
        )


def certificate_file_fingerprint(path: str | Path) -> str:
    """The SHA-256 fingerprint of the first certificate in a PEM file."""
    text = Path(path).read_text(encoding="ascii", errors="replace")
    end = "-----END CERTIFICATE-----"
    if end not in text:
        raise InvalidRequest(f"{path} holds no PEM certificate")
    first = text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)]
    return wire.certificate_fingerprint(ssl.PEM_cert_to_DER_cert(first))


def default_tls_dir() -> Path:
    from engine.files.user_folders import user_config_dir

    return user_config_dir() / "server-tls"


def self_signed_certificate(folder: str | Path, hosts: list[str], days: int = 825) -> tuple[Path, Path]:
    """A self-signed certificate and key in ``folder`` (kept and reused while valid for 30 more days).

    Reusing it keeps the fingerprint clients pinned. The key file is readable by its owner only.
    """
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = Path(folder).expanduser()
    cert_path, key_path = folder / "server-cert.pem", folder / "server-key.pem"
    now = datetime.now(UTC)
    if cert_path.is_file() and key_path.is_file():
        with contextlib.suppress(ValueError, OSError):
            existing = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if existing.not_valid_after_utc > now + timedelta(days=30):
                return cert_path, key_path
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", "::1", *hosts]):
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            names.append(x509.DNSName(host))
        else:
            if not address.is_unspecified:
                names.append(x509.IPAddress(address))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "VolSynth engine server")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for path, data, mode in (
        (key_path, key_bytes, 0o600),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644),
    ):
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    return cert_path, key_path
