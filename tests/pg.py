"""A real PostgreSQL server for the tests (no mock): Debian's ``postgresql`` binaries,
a temporary data directory, a free TCP port on 127.0.0.1, password auth.

``initdb`` and the server refuse to run as root, and the suite runs as root in CI:
then they run as ``nobody`` (its groups only) in a directory it owns under the
system's temp dir. ``tests/setup/install-postgresql.sh`` (run by ``make test``)
installs the binaries where they are missing; without them the tests that need a
server skip and say so.

Fixtures (tests/conftest.py imports them): ``pg_server`` (one server for the
session) and ``pg_url`` (a fresh database on it per test, dropped after).
``PgServer`` itself is for a test that stops and restarts its own server.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

UNPRIVILEGED = "nobody"  # who runs initdb and the server when the suite runs as root
USER = "artemis"  # the database superuser initdb creates
START_TIMEOUT_S = 60


def pg_bindir() -> Path | None:
    """The newest PostgreSQL's binaries (Debian keeps them in /usr/lib/postgresql/N/bin),
    or wherever ``initdb`` is on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).resolve().parent if which else None


def missing() -> str | None:
    """Why no server can be started here, or None."""
    if pg_bindir() is None:
        return "PostgreSQL is not installed (tests/setup/install-postgresql.sh; make test runs it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(UNPRIVILEGED)
        except KeyError:
            return f"running as root and there is no {UNPRIVILEGED!r} user to run PostgreSQL as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server in a temporary directory; ``start``/``stop`` are pg_ctl's."""

    def __init__(self) -> None:
        why = missing()
        if why:
            pytest.skip(why)
        bindir = pg_bindir()
        assert bindir is not None
        self.bindir = bindir
        self.password = secrets.token_hex(8)
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="artemis-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam(UNPRIVILEGED)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self._as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as:
            os.chown(pwfile, self._as["user"], self._as["group"])
        self._run(
            "initdb",
            *("-D", str(self.data), "-U", USER, "--pwfile", str(pwfile)),
            *("--auth-host=scram-sha-256", "--auth-local=reject"),
            *("--no-locale", "--encoding=UTF8", "--no-sync", "--no-instructions"),
        )
        pwfile.unlink()

    def _run(self, tool: str, *args: str, timeout: float = START_TIMEOUT_S) -> str:
        p = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            **self._as,
        )
        if p.returncode != 0:
            log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n{p.stdout}{p.stderr}\n{log}")
        return p.stdout

    def start(self) -> None:
        # TCP on loopback only (no Unix socket); durability off: a test server.
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k '' -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")

    def stop(self) -> None:
        """A fast shutdown: sessions are cut, as when a database server goes away."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{db}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as c:
            c.execute(sql)

    def create_db(self, name: str) -> str:
        self.admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_db(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def pg_started() -> Iterator[PgServer]:
    srv = PgServer()
    try:
        srv.start()
        yield srv
    finally:
        srv.destroy()


_dbs = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    with pg_started() as srv:
        yield srv


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database for one test (its URL has the password)."""
    name = f"t{os.getpid()}_{next(_dbs)}"
    url = pg_server.create_db(name)
    try:
        yield url
    finally:
        if pg_server.running():
            pg_server.drop_db(name)
