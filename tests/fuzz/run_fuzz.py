"""Run one fuzz target under atheris (coverage-guided, libFuzzer's engine).

    python tests/fuzz/run_fuzz.py TARGET [--corpus DIR] [-max_total_time=N] [libFuzzer flags]

``--corpus DIR``: the working corpus; the generated seeds (fuzz_targets.seeds)
and the kept inputs of tests/fuzz/corpus/TARGET/ are written into it first,
and libFuzzer adds what it finds there.

TARGET is one of fuzz_targets.TARGETS. A crash (an exception other than the
target's documented refusal) makes libFuzzer write the input as
``<artifact_prefix>crash-<sha1>`` and exit non-zero; keep it in
tests/fuzz/corpus/TARGET/ and tests/fuzz/test_fuzz.py replays it from then on.
The per-target scripts (fuzz_frame.py, ...) call ``main`` with their target.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(target: str, argv: list[str]) -> None:
    with atheris.instrument_imports(include=["artemis", "fuzz_targets"]):
        import fuzz_targets

        for mod in fuzz_targets.MODULES[target]:
            importlib.import_module(mod)
    one_input = fuzz_targets.TARGETS[target]
    if "--corpus" in argv:
        i = argv.index("--corpus")
        corpus = Path(argv[i + 1])
        del argv[i : i + 2]
        fuzz_targets.prepare_corpus(target, corpus)
        argv.append(str(corpus))
    atheris.Setup([sys.argv[0], *argv], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
