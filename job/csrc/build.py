"""Build the ``artemis`` backend's C++ hot path (``make backend-ext``; docs/DESIGN.md,
"The artemis backend: two paths").

Compiles ``timed_backend.cpp`` with ``torch.utils.cpp_extension`` (ninja) against
the installed torch into ``build/backend-ext/`` and places the module in
``job/_ext/`` (both gitignored), where ``artemis.job.backend`` looks for it.
Without torch it says so and exits 0 (the backend is then not importable either).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NAME = "artemis_timed_backend"


def main() -> int:
    try:
        from torch.utils import cpp_extension
    except ImportError:
        print("torch is not installed: the artemis backend's C++ path is not built")
        return 0
    # cpp_extension builds with ninja: the system's, or the venv's (pip's ninja).
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("ninja") is None:
        print(
            "ninja is not installed (apt install ninja-build, or pip install ninja): "
            "the artemis backend's C++ path is not built",
            file=sys.stderr,
        )
        return 1
    build = ROOT / "build" / "backend-ext"
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cpp_extension.load(
        name=NAME,
        sources=[str(HERE / "timed_backend.cpp")],
        extra_include_paths=[str(ROOT / "profiler_plugin")],  # artemis_ring.h: the ring format
        extra_cflags=["-O2", "-Wall", "-Werror"],
        build_directory=str(build),
        verbose=False,
    )
    built = next(build.glob(f"{NAME}*.so"))
    dest = HERE.parent / "_ext"
    dest.mkdir(exist_ok=True)
    # A new inode, so a process that has the old module mapped keeps it intact.
    tmp = dest / f".{built.name}.tmp"
    shutil.copy2(built, tmp)
    tmp.replace(dest / f"{NAME}.so")
    # The torch it was built against: the backend loads it only under the same one.
    import torch

    (dest / f"{NAME}.torch").write_text(torch.__version__ + "\n")
    print(f"built {dest / (NAME + '.so')} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
