"""``PostgresStore``: the fleet's store, one PostgreSQL database (psycopg 3).

Every coordinator of a cluster can point ``store`` at one database; the SQL
and the migrations are the SQLite store's (store/sql.py, store/schema.py). The
connection is in autocommit mode and each write call is one explicit
transaction, so a reader (``artemis incidents``, ``artemis report``, another
coordinator) sees each write whole. Migrations take an advisory lock, so
coordinators starting together on an old database migrate it once.

Messages name the store by its URL without the password (``redact``). A lost
connection (a server restarting, a network cut) raises a ``StoreError`` with
``transient`` set: the sink (store/sink.py) reconnects with back-off and
writes what it queued meanwhile.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

from artemis.store.base import StoreError, redact
from artemis.store.schema import CURRENT, POSTGRES, Db, migrate, version_of
from artemis.store.sql import SqlStore, check_version

CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout unless the URL sets one


def _transient(e: BaseException) -> bool:
    import psycopg

    # OperationalError: the connection failed or went away (also a server shutting
    # down, starting up, out of resources, a deadlock): all worth a later retry.
    return isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)


def check_url(url: str) -> dict[str, Any]:
    """The URL's connection parameters, checked without connecting: a ``StoreError``
    naming the (redacted) URL for what libpq would refuse or a host that cannot be
    looked up by name at all (not IDNA-encodable), never another exception."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise StoreError(f"{redact(url)}: psycopg is not installed ({e})") from e
    try:
        params = conninfo_to_dict(url)
    except Exception as e:  # psycopg.ProgrammingError, a value that is no UTF-8, ...
        # libpq may quote the URL back: never with its password.
        msg = str(e).replace(url, redact(url))
        raise StoreError(f"{redact(url)}: not a PostgreSQL URL: {msg}") from None
    for host in str(params.get("host") or "").split(","):
        if host and not host.startswith("/"):  # a socket directory is a path
            try:
                host.encode("idna")
            except UnicodeError:
                raise StoreError(f"{redact(url)}: not a PostgreSQL URL: bad host name") from None
    return params


class PostgresStore(SqlStore):
    def __init__(self, url: str, *, readonly: bool = False) -> None:
        try:
            import psycopg
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise StoreError(f"{redact(url)}: psycopg is not installed ({e})") from e
        self.url = redact(url)
        self.where = self.url
        self.readonly = readonly
        self.version = 0
        self.upgraded: list[int] = []  # versions applied by this open
        self.driver_errors = (psycopg.Error,)
        kw: dict[str, Any] = {"autocommit": True, "application_name": "artemis"}
        if "connect_timeout" not in check_url(url):
            kw["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            self.db = psycopg.connect(url, **kw)
        except (UnicodeError, ValueError) as e:  # a host name getaddrinfo cannot take
            raise StoreError(f"{self.url}: not a PostgreSQL URL: {e}") from None
        except psycopg.Error as e:
            # libpq's message may quote the conninfo: keep only the URL's redacted form.
            raise StoreError(
                f"{self.url}: cannot connect: {_scrub(str(e), url)}", transient=_transient(e)
            ) from None
        self._db = Db(self.db, POSTGRES)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def is_transient(self, e: BaseException) -> bool:
        return _transient(e)

    def _open(self) -> None:
        import psycopg

        try:
            try:
                v = version_of(self._db)
            except LookupError as e:
                raise StoreError(f"{self.url}: not an Artemis store: a database with {e}") from None
            check_version(self.url, v, self.readonly)
            if self.readonly:
                self.db.execute("SET default_transaction_read_only = on")
            else:
                self.upgraded = migrate(self._db)
        except psycopg.Error as e:
            raise StoreError(
                f"{self.url}: cannot open the store: {e}", transient=_transient(e)
            ) from e
        self.version = CURRENT

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.db.close()


def _scrub(msg: str, url: str) -> str:
    """``msg`` with the URL's password (if any, as written or decoded) taken out."""
    from psycopg.conninfo import conninfo_to_dict

    secrets = set()
    with contextlib.suppress(Exception):
        secrets.add(urlsplit(url).password or "")
    with contextlib.suppress(Exception):
        secrets.add(str(conninfo_to_dict(url).get("password") or ""))
    for pw in sorted(secrets - {""}, key=len, reverse=True):
        msg = msg.replace(pw, "***")
    return msg
