"""The docs stay usable: the README is a newcomer's first page (at most 250 lines,
the two commands verbatim), every relative markdown link resolves to a file and,
with an #anchor, to a heading there, and every alert's runbook names a heading
that exists (issue 28, "Docs")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RULES = REPO / "deploy" / "prometheus" / "artemis-rules.yml"
SKIP_DIRS = {".git", ".venv", "node_modules", "build", "out"}
# [text](target) and ![alt](target); a scheme (http:, mailto:) is not ours to check.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return sorted(
        p for p in REPO.rglob("*.md") if not SKIP_DIRS.intersection(p.relative_to(REPO).parts)
    )


def prose(path: Path) -> str:
    """The file without its fenced code blocks (links there are examples)."""
    out, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(path).splitlines() if line.startswith("#")}


def test_readme_is_a_first_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert re.search(r"^make demo +# ", text, re.M)
    assert re.search(r"^make test +# ", text, re.M)


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    bad = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no such heading")
    assert not bad, bad


def test_runbooks_name_a_heading() -> None:
    runbooks = re.findall(r'runbook: "([^"#]+)#([^"]+)"', RULES.read_text(encoding="utf-8"))
    assert runbooks
    for path, anchor in runbooks:
        dest = REPO / path
        assert dest.exists(), path
        assert anchor in anchors(dest), f"{path}#{anchor}"
