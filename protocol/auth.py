"""Shared-secret loading and mutual HMAC-SHA256 challenge-response.

Handshake (see protocol/README.md): the agent sends a random nonce in Hello;
the coordinator answers with its own nonce and ``proof(secret, "coordinator",
na, nc)``; the agent checks it (so it never talks to an impostor coordinator)
and answers with ``proof(secret, "agent", na, nc)``. Binding the role into the
MAC means a proof can never be reflected back as the other side's, and fresh
nonces from both sides mean a recorded handshake cannot be replayed.

The secret file must be a regular file owned by the current user and not
readable or writable by group or others (mode 0600 or stricter), like an ssh
key: a secret other users can read is not a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

NONCE_BYTES = 32
PROOF_BYTES = 32
ROLES = ("agent", "coordinator")
_DOMAIN = b"artemis-auth-v1"


class SecretFileError(ValueError):
    """The secret file is missing, unreadable, too open, not ours or empty."""


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the shared secret, refusing files that are unsafe or empty.

    Trailing whitespace (the newline an editor adds) is stripped, so the same
    file works however it was written.
    """
    p = os.fspath(path)
    try:
        # Open first and check the opened file: checking the path and then
        # opening it would let the file be swapped in between.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise SecretFileError(f"secret file {p} does not exist") from None
    except PermissionError:
        raise SecretFileError(f"secret file {p} is not readable by this user") from None
    except OSError as e:
        raise SecretFileError(f"secret file {p} cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"secret file {p} is not a regular file")
        if st.st_uid != os.getuid():
            raise SecretFileError(
                f"secret file {p} is owned by uid {st.st_uid}, expected the current user"
                f" (uid {os.getuid()})"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise SecretFileError(
                f"secret file {p} has mode {mode:04o}, expected 0600 (or stricter);"
                f" fix it with: chmod 600 {p}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(1 << 20)
    finally:
        os.close(fd)
    secret = data.rstrip()
    if not secret:
        raise SecretFileError(f"secret file {p} is empty")
    return secret


def make_nonce() -> bytes:
    """A fresh random challenge (32 bytes from the OS CSPRNG)."""
    return secrets.token_bytes(NONCE_BYTES)


def proof(secret: bytes, role: str, nonce_agent: bytes, nonce_coord: bytes) -> bytes:
    """HMAC-SHA256 over the role and both nonces: what ``role`` sends to prove the secret."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    r = role.encode()
    # Length-prefix every part so no two different inputs share a MAC input.
    msg = b"".join(
        len(part).to_bytes(2, "big") + part for part in (_DOMAIN, r, nonce_agent, nonce_coord)
    )
    return hmac.new(secret, msg, hashlib.sha256).digest()


_make_proof = proof


def check(secret: bytes, role: str, nonce_agent: bytes, nonce_coord: bytes, proof: bytes) -> bool:
    """True when ``proof`` is ``role``'s proof for these nonces (constant-time compare)."""
    return hmac.compare_digest(_make_proof(secret, role, nonce_agent, nonce_coord), proof)
