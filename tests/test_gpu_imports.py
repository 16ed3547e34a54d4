"""`make test` import-checks tests/gpu/ (run on a lent GPU machine only, never in CI): its
modules compile, and every artemis name they import (at module level, inside tests, in
the scripts they hand to subprocesses, in run.sh) resolves, so a moved module cannot
leave them stale until the next GPU run."""

from __future__ import annotations

import ast
import importlib
import py_compile
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from artemis.common.tomlfile import read_toml

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "tests" / "gpu"
MODULES = sorted(GPU.glob("*.py"))
# The rooms the project installs: each folder <room>/ is the package artemis.<room>.
ROOMS = sorted(
    {p.split(".")[1] for p in read_toml(REPO / "pyproject.toml")["tool"]["setuptools"]["packages"]}
)


def _artemis_imports(tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(module, name or None) for every artemis import in `tree`, and in any string in it
    that holds Python code (a script run in a subprocess)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("artemis."):
                    yield a.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("artemis"):
                for a in node.names:
                    yield node.module, a.name
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "artemis." in node.value
            and "import" in node.value
        ):
            try:
                inner = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            yield from _artemis_imports(inner)


def _resolves(module: str, name: str | None) -> bool:
    mod = importlib.import_module(module)
    if name is None or hasattr(mod, name):
        return True
    importlib.import_module(f"{module}.{name}")  # a submodule
    return True


def test_there_are_gpu_modules() -> None:
    assert [p.name for p in MODULES] == ["test_nccl_plugin_real.py", "test_nvml_real.py"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_gpu_module_compiles_and_its_artemis_imports_resolve(path: Path, tmp_path: Path) -> None:
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)
    found = list(_artemis_imports(ast.parse(path.read_text(encoding="utf-8"))))
    assert found, f"{path.name} imports nothing from artemis: is this check still reading it?"
    for module, name in found:
        assert _resolves(module, name), (path.name, module, name)


def test_run_sh_imports_resolve_and_its_farm_has_every_room() -> None:
    text = (GPU / "run.sh").read_text(encoding="utf-8")
    mods = re.findall(r"\bimport ((?:artemis\.[\w.]+(?:, )?)+)", text)
    assert mods
    for group in mods:
        for m in group.split(", "):
            importlib.import_module(m.strip())
    farm = re.search(r"for p in ([\w ]+); do\s+ln -s", text)
    assert farm is not None
    assert sorted(farm.group(1).split()) == ROOMS
