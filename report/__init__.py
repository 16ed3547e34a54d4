"""artemis.report: a self-contained HTML incident report per job (report/README.md).

html     render(bundle) -> str: the page, pure
story    the job's headline numbers and each incident's story in words, pure
charts   the incident's plots (pace, step time, throughput), pure
svg      the small SVG writer its plots use
load     bundles from a store or from a findings file (the shell's side)
browser  headless Chromium over its DevTools pipe (tests, make docs-screenshot)
cli      `artemis report`
"""

from __future__ import annotations

from .html import render

__all__ = ["render"]
