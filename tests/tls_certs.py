"""A self-signed certificate for localhost, made by openssl: the TLS tests' server side."""

from __future__ import annotations

import subprocess
from pathlib import Path


def localhost_cert(tmp: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `tmp`, valid a day for DNS:localhost and 127.0.0.1."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
