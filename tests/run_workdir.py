"""``artemis run --keep-workdir``'s folder (coordinator and agent logs, rings, the
coordinator's state) moved into the test's tmp dir, so a failed end-to-end run can
be read afterwards (pytest keeps the last three runs' tmp dirs)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

KEEP = "--keep-workdir"
_KEPT = re.compile(r"^\[artemis\] logs and rings kept in (\S+)$", re.M)


def keep_workdir(out: str, tmp: Path) -> Path | None:
    """Move the folder the run printed into ``tmp/artemis-run``; its new path."""
    m = _KEPT.search(out)
    if m is None or not Path(m.group(1)).is_dir():
        return None
    dest = tmp / "artemis-run"
    shutil.move(m.group(1), dest)
    return dest
