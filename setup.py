"""Build hook: compile the profiler plugin and ship it inside artemis.agent.

Everything else lives in pyproject.toml. `pip install .` and `pip install -e .`
both run build_py, which runs `make -C profiler_plugin` and copies the shared
object into agent/_plugin/ so `artemis-agent plugin-path` can find it.
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PLUGIN = "libnccl-profiler-artemis.so"


class BuildWithPlugin(build_py):
    def run(self) -> None:
        subprocess.check_call(["make", "-C", str(HERE / "profiler_plugin"), "lib"])
        dest = HERE / "agent" / "_plugin"
        dest.mkdir(exist_ok=True)
        built = HERE / "profiler_plugin" / "build"
        # One library for NCCL and RCCL (RCCL loads profiler plugins under NCCL's prefix).
        shutil.copy2(built / PLUGIN, dest / PLUGIN)
        shutil.copy2(HERE / "profiler_plugin" / "artemis_ring.h", dest / "artemis_ring.h")
        # The simulator's stand-in NCCL (sim/hostproc.py), beside the plugin.
        (dest / "standin").mkdir(exist_ok=True)
        shutil.copy2(built / "standin" / "libnccl.so.2", dest / "standin" / "libnccl.so.2")
        super().run()


setup(cmdclass={"build_py": BuildWithPlugin})
