"""The import rules between rooms (issue 28 "Rooms match folders"), read from the source.

Every import statement counts: at module level, inside functions, under
`TYPE_CHECKING`, relative ones resolved. (test_ring_layout.py's
`test_job_writer_imports_no_agent_machinery` checks what the job side loads at run time;
these check what any module could load.)
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOMS = (
    "agent",
    "cli",
    "common",
    "coordinator",
    "detect",
    "job",
    "protocol",
    "rebalance",
    "regress",
    "report",
    "ring",
    "sim",
    "store",
)
# The pure core: no sockets, files, clocks, threads or logging side effects.
CORE = "detect"
CORE_FORBIDDEN = (
    "socket",
    "asyncio",
    "subprocess",
    "threading",
    "sqlite3",
    "psycopg",
    "structlog",
    "logging",
    "prometheus_client",
    "artemis.common.diskio",
    "artemis.common.lifecycle",
    "artemis.common.aio",
    "artemis.common.logs",
    "artemis.store",
    "artemis.coordinator",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["artemis", *parts])


def imports(path: Path, source: str | None = None) -> Iterator[str]:
    """Every module `path` imports, anywhere in it, as an absolute dotted name
    (`source`: its text, if not read from the file)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(source or path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            # `from artemis import store` / `from artemis.common import diskio`
            yield from (f"{mod}.{a.name}" for a in node.names if a.name != "*")


def product_files() -> Iterator[tuple[str, Path]]:
    for room in ROOMS:
        for p in sorted((REPO / room).rglob("*.py")):
            yield room, p


def _matches(mod: str, name: str) -> bool:
    return mod == name or mod.startswith(name + ".")


def room_edges() -> dict[str, dict[str, list[str]]]:
    """room -> the rooms it imports -> the files (and modules) that do."""
    edges: dict[str, dict[str, list[str]]] = {r: {} for r in ROOMS}
    for room, p in product_files():
        for mod in imports(p):
            parts = mod.split(".")
            if len(parts) < 2 or parts[0] != "artemis" or parts[1] == room:
                continue
            if parts[1] in ROOMS:
                where = f"{p.relative_to(REPO)}: {mod}"
                edges[room].setdefault(parts[1], []).append(where)
    return edges


def _cycle(edges: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle between rooms (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(r: str) -> list[str] | None:
        state[r] = 1
        path.append(r)
        for t in sorted(edges.get(r, {})):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        path.pop()
        state[r] = 2
        return None

    for r in ROOMS:
        if r not in state:
            found = visit(r)
            if found:
                return found
    return None


def test_no_import_cycle_between_rooms() -> None:
    edges = room_edges()
    cycle = _cycle(edges)
    if cycle is not None:
        why = [f"{a} -> {b}: {edges[a][b][:3]}" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("import cycle between rooms:\n" + "\n".join(why))


def test_the_core_imports_no_io() -> None:
    found = set()
    for room, p in product_files():
        if room != CORE:
            continue
        rel = str(p.relative_to(REPO))
        for mod in imports(p):
            for bad in CORE_FORBIDDEN:
                if _matches(mod, bad):
                    found.add((rel, bad))
    assert not found, f"the pure core imports I/O: {sorted(found)}"


def test_the_import_reader_sees_every_form() -> None:
    """Function-level, TYPE_CHECKING and relative imports all count."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import socket\n"
        "def f():\n    from artemis.common import diskio\n"
        "from . import findings\nfrom ..store import sink\n"
    )
    # read as if it lay in detect/ (relative imports resolve against its package)
    got = set(imports(REPO / "detect" / "x.py", src))
    assert {"socket", "artemis.common.diskio", "artemis.detect.findings"} <= got
    assert "artemis.store.sink" in got


def test_the_cycle_finder_finds_one() -> None:
    edges = {"agent": {"protocol": ["a"]}, "protocol": {"ring": ["b"]}, "ring": {"agent": ["c"]}}
    assert _cycle(edges) == ["agent", "protocol", "ring", "agent"]
    assert _cycle({"agent": {"ring": ["a"]}, "ring": {}}) is None
