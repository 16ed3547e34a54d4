"""`artemis-coordinator set` is for the control socket's owner and group only.

A real `artemis-coordinator serve` makes its control socket mode 0660 and checks
every connection's credentials (SO_PEERCRED) against the socket file's owner
and group. The other user is `nobody`: a child process imports the CLI as root,
drops to uid/gid 65534 (os.setuid) and runs the real command's function
in-process (the interpreter lives under /root, which nobody may not read, so
nothing may be imported after the switch).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import Coordinator, wait_for, write_secret

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user"),
]

NOBODY = 65534

_AS_USER = """
import os, sys
from pathlib import Path
import typer
from artemis.coordinator import cli
uid, gid, cmd, *args = sys.argv[1:]
os.setgroups([])
os.setgid(int(gid))
os.setuid(int(uid))
# The command's own function (what typer calls), so nothing is imported from
# here on: the standard library under /root is out of nobody's reach.
fn = {"set": cli.set_, "settings": cli.settings}[cmd]
try:
    fn(*args[:-2], socket_path=Path(args[-1]))
except typer.Exit as e:
    sys.exit(e.exit_code)
"""


def _cli(sock: Path, *args: str, uid: int = NOBODY, gid: int = NOBODY) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, "-c", _AS_USER, str(uid), str(gid), *args, "--socket", str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return p.returncode, p.stdout + p.stderr


@pytest.fixture
def coordinator() -> Iterator[Coordinator]:
    # A folder `nobody` may enter (pytest's tmp dirs are 0700): only the socket's
    # own mode and the credentials check keep it out.
    work = Path(tempfile.mkdtemp(prefix="artemis-ctl-"))
    os.chmod(work, 0o755)
    c = Coordinator(work, write_secret(work / "secret")).start()
    try:
        wait_for(c.sock.exists, 10, "control socket")
        yield c
    finally:
        assert c.daemon is not None
        c.daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_another_user_is_refused_and_the_owner_and_group_are_not(
    coordinator: Coordinator,
) -> None:
    sock = coordinator.sock
    st = sock.stat()
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_uid == os.getuid()
    # 1. The socket file's mode keeps `nobody` out, and the CLI says why.
    rc, out = _cli(sock, "set", "suspect_ratio", "1.3")
    assert rc == 2, out
    assert "permission denied" in out and "only its owner and group" in out, out
    # 2. Widened by mistake to 0666: the coordinator's own credentials check refuses.
    os.chmod(sock, 0o666)
    rc, out = _cli(sock, "set", "suspect_ratio", "1.3")
    assert rc == 1, out
    assert f"uid {NOBODY} (gid {NOBODY}) may not change the coordinator's settings" in out, out
    assert f"owner (uid {os.getuid()})" in out, out
    rc, out = _cli(sock, "settings")
    assert rc == 1 and "may not change" in out, out
    # Nothing changed; the owner (root, this test) may.
    from artemis.coordinator.cli import _ask

    assert _ask(sock, {"cmd": "get"})["settings"]["suspect_ratio"] != 1.3
    assert _ask(sock, {"cmd": "set", "key": "suspect_ratio", "value": "1.25"})["ok"]
    # 3. A member of the socket's group may too: give the socket nobody's group.
    os.chown(sock, os.getuid(), NOBODY)
    os.chmod(sock, 0o660)
    rc, out = _cli(sock, "set", "suspect_ratio", "1.2")
    assert rc == 0 and out.strip() == "suspect_ratio = 1.2", out
    log = coordinator.daemon.log_text()  # type: ignore[union-attr]
    assert log.count('"control socket peer refused"') == 2, log[-2000:]
