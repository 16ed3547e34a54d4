"""The ``artemis`` torch.distributed backend: a ProcessGroup that times every collective.

torch registers it at ``import torch`` (the ``torch.backends`` entry point,
job/_autoload.py), and ``import artemis.job`` does too; then
``dist.init_process_group(backend="artemis")`` (and every ``new_group`` of that
job) builds a group on one of two paths (docs/DESIGN.md, "The artemis backend:
two paths"): the C++ path (``ArtemisCppGroup``: c10d dispatches each call into
``job/csrc/timed_backend.cpp``, which writes the record; built by
``make backend-ext``), by default; or the Python path (``ArtemisProcessGroup``),
for islands, for CUDA tensors without the NCCL plugin, when the extension is not
built, or with ``ARTEMIS_BACKEND_IMPL=python``. Either wraps the real backend
(gloo for CPU tensors, nccl for CUDA tensors; ``ARTEMIS_INNER_BACKEND=gloo|nccl``
forces one) and hands each call to it unchanged, so results are the inner
backend's, bit for bit; both write the same records. What follows describes the
Python path; the C++ one does the same in C++. Around each call it writes one ring
record (docs/DESIGN.md, "Ring format") into
``$ARTEMIS_SHM_DIR/<job>.<comm>.r<rank>.ring``: in flight at the call (enqueue and
start from CLOCK_MONOTONIC, process CPU time at the start), done
when the inner Work's future completes (end, CPU time at the end). The rings
carry ``WRITER_BACKEND`` and 128-byte CPU slots; the node agent reads them like
the plugin's.

One source per collective: when the Artemis NCCL profiler plugin is loaded in
this process (``NCCL_PROFILER_PLUGIN`` names it, as ``artemis run`` exports, or
it is mapped), NCCL's collectives are left to the plugin, which sees them on the
device; only what the plugin cannot see (the gloo ones) is recorded here.

CUDA tensors without the plugin: CUDA events are recorded on the current stream
around the call and resolved off the hot path by a resolver thread (no sync in
the collective call); device times land as ``device_ns`` records.

Islands (``ARTEMIS_ISLANDS``, one island name per global rank): a group whose
members span several islands composes its CPU all_reduce as a mixed-vendor job
must (reduce in each island, the leaders over a bridge group, broadcast back),
writes the leaders' exchange as bridge records (``BridgeRingWriter``, as the
simulator does) and passes its other collectives through to the job-wide gloo
group; docs/DESIGN.md, "Ring", has the contract.

Why a wrapping backend at all: in torch 2.13 gloo has no observation hook, and NCCL's
completion hook (``ProcessGroupNCCL._register_on_completion_hook``) is private; the
NCCL profiler plugin covers NCCL, and this backend records what it cannot see.

Where the parts live: ``group`` (what both paths share: a ring and its counters, the
inner backends, ``ArtemisGroup``), ``python_path`` (``ArtemisProcessGroup``, its
collectives made from one table), ``islands`` (composition by island), ``cpp_path``
(the extension and ``ArtemisCppGroup``), ``_autoload`` (registration at ``import
torch``); this module picks each group's path and registers the creator.
"""

from __future__ import annotations

import os
from typing import Any

from ._autoload import register_creator
from .cpp_path import _BUILD_HINT, ArtemisCppGroup, cpp_group_class, load_ext
from .cpp_path import _ext_cache as _ext_cache  # the tests reset it through this module
from .group import (
    BACKEND_NAME,
    CLOSE_WAIT_S,
    ArtemisGroup,
    _forced_inner,
    _wants_nccl,
    job_name,
    log,
    plugin_loaded,
)
from .islands import _ISLANDS_ENV, island_names
from .python_path import ArtemisProcessGroup

_IMPL_ENV = "ARTEMIS_BACKEND_IMPL"  # auto (default) | cpp | python


def _python_path_reason(forced: str) -> str:
    """Why a group must take the Python path ("" when the C++ path can take it)."""
    impl = os.environ.get(_IMPL_ENV, "auto").strip().lower() or "auto"
    if impl not in ("auto", "cpp", "python"):
        raise ValueError(f"{_IMPL_ENV}={impl!r}: expected auto, cpp or python")
    if impl == "python":
        return f"{_IMPL_ENV}=python"
    why = ""
    if island_names() is not None:
        why = f"{_ISLANDS_ENV} is set (islands compose their collectives in Python)"
    elif _wants_nccl(forced) and not plugin_loaded():
        why = "CUDA tensors without the NCCL plugin (CUDA events are recorded in Python)"
    elif load_ext() is None:
        why = "the C++ path is not built"
    if why and impl == "cpp":
        raise RuntimeError(
            f"{_IMPL_ENV}=cpp, but {why}" + (f": {_BUILD_HINT}" if "built" in why else "")
        )
    return why


def _create(opts: Any, pg_options: Any) -> Any:
    """The backend's creator: the C++ path when it is built and the group needs neither
    islands nor CUDA events, else the Python path (a debug line says which)."""
    why = _python_path_reason(_forced_inner())
    cls: Any = ArtemisProcessGroup if why else cpp_group_class()
    log.debug(
        "artemis backend: group %s takes the %s path%s",
        opts.group_id,
        "Python" if why else "C++",
        f" ({why})" if why else "",
    )
    return cls(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        group_id=str(opts.group_id),
        global_ranks=list(opts.global_ranks_in_group),
    )


def register() -> None:
    """Register the ``artemis`` backend with torch.distributed (idempotent)."""
    register_creator(_create)


__all__ = [
    "BACKEND_NAME",
    "CLOSE_WAIT_S",
    "ArtemisCppGroup",
    "ArtemisGroup",
    "ArtemisProcessGroup",
    "island_names",
    "job_name",
    "load_ext",
    "plugin_loaded",
    "register",
]
