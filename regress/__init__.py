"""`artemis regress`: a fixed micro-benchmark on one node, kept in the store and judged
against the node's own earlier runs and its same-hardware peers (regress/README.md).

``bench.py`` measures (torch: GEMM, an all_reduce sweep among local ranks, a
host-to-device copy); ``core.py`` is the pure judgement (baselines, the noise rule,
findings); ``textfile.py`` writes the Prometheus textfile; ``cli.py`` is the command.
"""
