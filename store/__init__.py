"""The incident store: jobs, incidents, actions and per-window rows, kept across runs.

``open_store(url)`` opens one behind the ``Store`` interface: ``sqlite:///PATH``
(embedded, the default, a file next to the findings) or ``postgresql://...``
(one database for a fleet of coordinators). ``open_for_findings(F)`` opens what sits next to a findings
file: the store, else ``incidents.jsonl`` (read-only). store/README.md and
docs/DESIGN.md "The store" have the schema, its versions and the URLs.
"""

from artemis.store.base import (
    DEFAULT_STORE_NAME,
    Store,
    StoreError,
    default_store_path,
    open_for_findings,
    open_store,
    store_url,
)

__all__ = [
    "DEFAULT_STORE_NAME",
    "Store",
    "StoreError",
    "default_store_path",
    "open_for_findings",
    "open_store",
    "store_url",
]
