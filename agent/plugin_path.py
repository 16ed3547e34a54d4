"""Where the compiled profiler plugin lives (what a job puts in NCCL_PROFILER_PLUGIN)."""

from __future__ import annotations

from pathlib import Path

PLUGIN_NAME = "libnccl-profiler-artemis.so"


class PluginNotFoundError(FileNotFoundError):
    """Neither the installed nor the source-checkout plugin exists."""


def plugin_candidates() -> tuple[Path, Path]:
    """(installed copy next to this package, build output in a source checkout)."""
    pkg = Path(__file__).resolve().parent
    return (
        pkg / "_plugin" / PLUGIN_NAME,
        pkg.parent / "profiler_plugin" / "build" / PLUGIN_NAME,
    )


def plugin_path() -> Path:
    """Absolute path of the plugin; the installed copy wins over the build folder."""
    installed, built = plugin_candidates()
    for p in (installed, built):
        if p.is_file():
            return p
    raise PluginNotFoundError(
        f"the Artemis profiler plugin is not built: looked for {installed} and {built}; "
        "run `make plugin` in the source checkout"
    )
