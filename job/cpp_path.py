"""The ``artemis`` backend's C++ path: loading the extension (job/csrc/timed_backend.cpp,
built by ``make backend-ext``) and ``ArtemisCppGroup``, the group c10d dispatches straight
into it; ``artemis.job.backend`` says when this path is taken."""

from __future__ import annotations

import atexit
import importlib.util
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from artemis.ring.writer import RingWriter

from .group import CLOSE_WAIT_S, ArtemisGroup, _Comm, _forced_inner, _inner_backends, dist, log

_EXT_NAME = "artemis_timed_backend"
_EXT_DIR = Path(__file__).resolve().parent / "_ext"  # where `make backend-ext` puts it
_BUILD_HINT = "build it with `make backend-ext` (or `python job/csrc/build.py`)"
_ext_cache: dict[Path, Any] = {}


def load_ext(ext_dir: Path | None = None) -> Any:
    """The C++ backend module (job/csrc/timed_backend.cpp) when built for this torch,
    else None, said once in a log line with how to build it."""
    d = _EXT_DIR if ext_dir is None else ext_dir
    if d in _ext_cache:
        return _ext_cache[d]
    mod: Any = None
    so, tag = d / f"{_EXT_NAME}.so", d / f"{_EXT_NAME}.torch"
    why = ""
    if not so.is_file():
        why = f"{so} is not built"
    elif not tag.is_file() or tag.read_text().strip() != torch.__version__:
        why = f"{so} was built for another torch than {torch.__version__}"
    else:
        try:
            spec = importlib.util.spec_from_file_location(_EXT_NAME, so)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except (ImportError, OSError) as e:
            why, mod = f"{so} does not load ({e})", None
    if mod is None:
        log.warning(
            "artemis backend: the C++ path is not available (%s); collectives take the "
            "Python path (about 13 us of CPU each, bench/README.md); %s",
            why,
            _BUILD_HINT,
        )
    _ext_cache[d] = mod
    return mod


# The rings the C++ backend finishes: its shutdown (inside destroy_process_group) does
# not come back through Python, so a clean exit removes those it finished that no one
# reads (artemis.ring.lifetime); an unfinished one keeps its lock to the process's end.
_CPP_RINGS: list[RingWriter] = []


def _retire_finished_rings() -> None:
    for w in _CPP_RINGS:
        w.release(only_finished=True)


atexit.register(_retire_finished_rings)


class _CppGroupAttrs(ArtemisGroup):
    """The C++ path: a plain c10d ProcessGroup whose backend for CPU (and CUDA) tensors
    is the C++ ``TimedBackend`` (job/csrc/timed_backend.cpp) around the inner backend.

    No Python runs per collective: c10d dispatches straight into the C++ backend,
    which writes the ring records. This object only holds the group's attributes
    (ring path, comm key, counters) for the detector, the tests and ``artemis run``.
    NCCL's collectives are left to the plugin (this path is taken with NCCL only when
    the plugin is loaded), so only CPU tensors are recorded.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        group_id: str = "",
        global_ranks: list[int] | None = None,
        *,
        inner: Any = None,
    ) -> None:
        """``inner``: an existing c10d Backend to wrap for CPU tensors instead of building
        gloo/nccl from ``store``; the benchmark wraps torch's do-nothing one this way."""
        ext = load_ext()
        if ext is None:
            raise RuntimeError(f"the artemis backend's C++ path is not built: {_BUILD_HINT}")
        ext.ProcessGroupBase.__init__(self, store, rank, size)
        forced = _forced_inner()
        self._inner: dict[str, Any] = (
            {"cpu": inner}
            if inner is not None
            else _inner_backends(store, rank, size, timeout, forced)
        )
        self._finish_init(rank, size, group_id, global_ranks)
        cpu, cuda = self._inner.get("cpu"), self._inner.get("cuda")
        self._ring: Path | None = None
        self._ring_writer: RingWriter | None = None
        if cpu is not None:
            # The Python RingWriter makes the ring (header, env sidecar, rename into
            # place), as on the Python path; the C++ backend maps it and is its writer.
            comm = _Comm(
                self._shm,
                self._job,
                self._ring_key("nccl" if cpu is cuda else "gloo"),
                rank,
                size,
                self.global_rank,
                False,
            )
            self._ring = comm.ring.path
            comm.ring.close(finish=False)  # keeps the writer's lock until close_rings
            self._ring_writer = comm.ring
            _CPP_RINGS.append(comm.ring)
        self._tb: Any = ext.TimedBackend(
            cpu, cuda, str(self._ring or ""), rank, size, close_wait_s=CLOSE_WAIT_S
        )
        kind = dist.ProcessGroup.BackendType.CUSTOM
        pg: Any = self  # a ProcessGroupBase, which mypy cannot see through the extension
        for dev in ("cpu", "cuda"):
            if dev in self._inner:
                pg._register_backend(torch.device(dev), kind, self._tb)
        pg._set_default_backend(kind)

    @property
    def timed_backend(self) -> Any:
        """The C++ backend (a c10d Backend) this group dispatches to."""
        return self._tb

    def ring_path(self, device: str = "cpu") -> Path:
        if device != "cpu" or self._ring is None:
            raise RuntimeError(f"{device} collectives are recorded by the NCCL plugin here")
        return self._ring

    def next_coll_seq(self, device: str = "cpu") -> int:
        return int(self._tb.next_coll_seq()) if device == "cpu" else 0

    @property
    def inner(self) -> dict[str, Any]:
        return dict(self._inner)

    def close_rings(self, wait_s: float = 0.0) -> bool:
        done = bool(self._tb.close_ring(wait_s))
        if done and self._ring_writer is not None:
            self._ring_writer.release()  # finished by the C++ writer: remove it if unread
        return done


_cpp_group_cls: list[type] = []


def cpp_group_class() -> type:
    """``ArtemisCppGroup``: the C++ path's group class (``_CppGroupAttrs`` on the C++
    ``ProcessGroupBase``); made once the extension loads (``load_ext``)."""
    if not _cpp_group_cls:
        ext = load_ext()
        if ext is None:
            raise RuntimeError(f"the artemis backend's C++ path is not built: {_BUILD_HINT}")
        _cpp_group_cls.append(
            type(
                "ArtemisCppGroup", (_CppGroupAttrs, ext.ProcessGroupBase), {"__module__": __name__}
            )
        )
    return _cpp_group_cls[0]


def ArtemisCppGroup(*args: Any, **kwargs: Any) -> Any:  # a class to its callers
    """A C++-path group (see ``_CppGroupAttrs``); the arguments are ArtemisProcessGroup's."""
    return cpp_group_class()(*args, **kwargs)
