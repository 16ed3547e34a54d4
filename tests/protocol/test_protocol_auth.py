"""Secret files and the mutual HMAC proofs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from artemis.protocol.auth import SecretFileError, check, load_secret, make_nonce, proof
from protocol_helpers import SECRET, secret_file


def test_load_secret_strips_newline(tmp_path: Path) -> None:
    assert load_secret(secret_file(tmp_path)) == SECRET
    os.chmod(tmp_path / "secret", 0o400)
    assert load_secret(tmp_path / "secret") == SECRET


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_load_secret_refuses_open_modes(tmp_path: Path, mode: int) -> None:
    p = secret_file(tmp_path, mode=mode)
    with pytest.raises(SecretFileError) as ei:
        load_secret(p)
    text = str(ei.value)
    assert f"mode {mode:04o}" in text and "expected 0600" in text and str(p) in text


def test_load_secret_missing_empty_and_not_regular(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="does not exist"):
        load_secret(tmp_path / "nope")
    empty = secret_file(tmp_path, data=b"  ")
    with pytest.raises(SecretFileError, match="is empty"):
        load_secret(empty)
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(SecretFileError, match="not a regular file"):
        load_secret(d)
    # A symlink is refused rather than followed somewhere unexpected.
    link = tmp_path / "link"
    link.symlink_to(secret_file(tmp_path))
    with pytest.raises(SecretFileError, match="cannot be opened"):
        load_secret(link)


def test_proofs_are_mutual_and_bound_to_role_and_nonces() -> None:
    na, nc = make_nonce(), make_nonce()
    assert na != nc and len(na) == 32
    p_agent = proof(SECRET, "agent", na, nc)
    p_coord = proof(SECRET, "coordinator", na, nc)
    assert p_agent != p_coord and len(p_agent) == 32
    assert check(SECRET, "agent", na, nc, p_agent)
    assert check(SECRET, "coordinator", na, nc, p_coord)
    # A proof cannot be reflected as the other role's, replayed with other
    # nonces, or made without the secret.
    assert not check(SECRET, "coordinator", na, nc, p_agent)
    assert not check(SECRET, "agent", nc, na, p_agent)
    assert not check(SECRET, "agent", na, make_nonce(), p_agent)
    assert not check(b"other secret", "agent", na, nc, p_agent)
    with pytest.raises(ValueError, match="role"):
        proof(SECRET, "admin", na, nc)
