# Two commands do everything on a fresh machine:
#   make demo   - set up, then run the simulated cluster with a straggler, live
#   make test   - set up, then run the whole test suite (the real-PyTorch runs included)
# Also: make test-torch (just the real-PyTorch DDP runs judged end to end),
# make test-torch-repeat (those 20 times under two busy loops: a bench run), make bench,
# make lint, make plugin, make docs-screenshot, make clean; make reliability and
# make soak (long forms of docs/RELIABILITY.md).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PLUGIN  := agent/_plugin/libnccl-profiler-artemis.so
PYTEST_ARGS ?=

.PHONY: all setup plugin backend-ext demo sim test test-torch test-realjobs test-torch-repeat reliability test-c bench lint clean docs-screenshot fuzz soak

all: setup

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# The job-side tests use real PyTorch (CPU build); without it they skip and say so.
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch not installed: the PyTorch tests will skip"
	touch $(STAMP)

# Compile the plugin and place it where `artemis-agent plugin-path` looks.
plugin:
	$(MAKE) -C profiler_plugin lib
	mkdir -p agent/_plugin
	# --remove-destination: a new inode, so a process that has the old library
	# mapped keeps it intact.
	# One library for NCCL and RCCL: RCCL loads profiler plugins under NCCL's
	# libnccl-profiler prefix and the plugin detects RCCL from the process.
	cp --remove-destination profiler_plugin/build/libnccl-profiler-artemis.so profiler_plugin/artemis_ring.h agent/_plugin/
	# The simulator calls the plugin from inside the stand-in NCCL (its ncclGetVersion
	# plays the scenario's [software] nccl): shipped beside the plugin, never on a
	# library path.
	mkdir -p agent/_plugin/standin
	cp --remove-destination profiler_plugin/build/standin/libnccl.so.2 agent/_plugin/standin/

# The artemis torch.distributed backend's C++ hot path (job/csrc, docs/DESIGN.md "The
# artemis backend: two paths"), compiled against the venv's torch (~30-50 s); without
# it the backend takes its Python path and says so.
BACKEND_EXT := job/_ext/artemis_timed_backend.so
backend-ext: $(BACKEND_EXT)

$(BACKEND_EXT): $(STAMP) job/csrc/timed_backend.cpp job/csrc/build.py profiler_plugin/artemis_ring.h
	$(BIN)/python job/csrc/build.py

setup: $(STAMP) plugin backend-ext

demo: setup
	$(BIN)/artemis demo

# The suite runs in three parts. (1) Everything but the two below, on PYTEST_WORKERS
# processes (pytest-xdist; --dist loadfile: a file's tests stay on one worker, so a
# module's fixtures, the end-to-end scenarios' clusters among them, run once; nine
# end-to-end files took 168 s alone and 96-97 s on two workers, twice each, A/B and
# B/A, at a load average of 2-6).
# (2) SERIAL_TESTS, alone: they make network namespaces and veth pairs (partition,
# disk full, plugin hardening, the fleet member cut off from PostgreSQL), time
# `import torch` to the millisecond (autoload), or hold 10k connections / run 20
# torchrun jobs against a bound (hostile peers, ring lifetime: both ran past theirs
# beside another worker at a load average of 12).
# (3) The real-PyTorch runs (torch_e2e), alone: four ranks on this machine's cores,
# judged against each rank's own record of its CPU time (tests/rank_truth.py).
PYTEST_WORKERS ?= 2
SERIAL_TESTS := tests/test_partition.py tests/test_disk_full.py \
	tests/test_plugin_hardening.py tests/test_job_autoload.py \
	tests/test_hostile_peers.py tests/test_ring_lifetime.py tests/test_fleet_e2e_netns.py
TORCH_TESTS = $(shell grep -l "mark.torch_e2e" tests/test_*.py)
test: setup
	bash tests/setup/install-prometheus.sh
	bash tests/setup/install-postgresql.sh
	bash tests/setup/install-chromium.sh
	bash tests/setup/install-iproute2.sh
	$(MAKE) -C profiler_plugin test
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile \
		-m "not torch_e2e and not reliability and not realjobs" $(addprefix --ignore=,$(SERIAL_TESTS)) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m "not torch_e2e and not reliability and not realjobs" $(SERIAL_TESTS) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m torch_e2e $(TORCH_TESTS) $(PYTEST_ARGS)

# The long forms of docs/RELIABILITY.md's tests (each section says which):
# partitions of 30 s, 2 minutes of 20% loss + 200 ms delay, a flapping link (their
# figures printed and appended to out/reliability.jsonl); kills at random moments,
# 50 trials of each kind (coordinator, agent, both; figures into out/reliability).
RELIABILITY_OUT ?= out/reliability
reliability: setup
	bash tests/setup/install-iproute2.sh
	mkdir -p out
	ARTEMIS_RELIABILITY=1 ARTEMIS_RELIABILITY_OUT=$(CURDIR)/out/reliability.jsonl \
		$(BIN)/python -m pytest -q -s -m reliability $(PYTEST_ARGS)
	ARTEMIS_KILL_TRIALS=50 ARTEMIS_RELIABILITY_OUT=$(RELIABILITY_OUT) \
		$(BIN)/python -m pytest -q tests/test_kills.py $(PYTEST_ARGS)

# Real-PyTorch DDP jobs judged end to end (artemis run, artemis.job.Detector): the
# last part of `make test`, alone.
test-torch: setup
	$(BIN)/python -m pytest -q -m torch_e2e $(TORCH_TESTS) $(PYTEST_ARGS)

# One real cell of the real-job grid (bench/realjobs: the GPT job, a SIGSTOP duty
# cycle on rank 2), judged by issue 31's goals; it skips above a load average of 4.
test-realjobs: setup
	$(BIN)/python -m pytest -q -m realjobs tests/test_realjobs_grid.py $(PYTEST_ARGS)

# A bench run, not CI: the real-PyTorch runs TORCH_REPEAT times under two busy loops
# (`yes > /dev/null`, killed at the end); prints the pass count and the load average of
# each run, and keeps the logs in out/torch-repeat/.
TORCH_REPEAT ?= 20
test-torch-repeat: setup
	bash tests/torch_repeat.sh $(TORCH_REPEAT) out/torch-repeat $(BIN)/python -m pytest -q \
		-m torch_e2e $(TORCH_TESTS) $(PYTEST_ARGS)

# Coverage-guided fuzzing (atheris), long form: FUZZ_SECONDS per target (`make test`
# runs 6 s each). A crash stops it; the input is kept as out/fuzz/TARGET-crash-*:
# fix it and add it to tests/fuzz/corpus/TARGET/ (docs/RELIABILITY.md "6. Fuzzing").
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := frame ring scenario config store_url
fuzz: setup
	mkdir -p out/fuzz
	for t in $(FUZZ_TARGETS); do \
		$(BIN)/python tests/fuzz/fuzz_$$t.py --corpus out/fuzz/corpus-$$t \
			-max_total_time=$(FUZZ_SECONDS) -artifact_prefix=out/fuzz/$$t- \
			-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
			| tee out/fuzz/$$t.log | grep -E "^(Done|stat::number_of_executed_units|.*ERROR)" \
			|| exit 1; \
		grep -q "^Done" out/fuzz/$$t.log || exit 1; \
	done


# Soak: a virtual hour at 1k ranks (artemis loadtest) and a real-time hour of a
# small simulated job (SOAK_REAL_S seconds), the coordinator's RSS, open files,
# journal, findings and store sampled.
SOAK_REAL_S ?= 3600
soak: setup
	ARTEMIS_SOAK=long ARTEMIS_SOAK_REAL_S=$(SOAK_REAL_S) ARTEMIS_RELIABILITY_OUT=out/soak \
		$(BIN)/python -m pytest -q -s tests/test_soak.py $(PYTEST_ARGS)

bench: setup
	$(MAKE) -C profiler_plugin bench
	$(BIN)/python -m bench

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy agent coordinator protocol sim job rebalance store report regress ring common cli detect

# docs/incident-report.png: the report of a real simulated run (the flagship
# scenario, rebalancing on), rendered by headless Chromium (docs/OPERATING.md "Reading an incident").
DOCS_RUN := out/docs-report
docs-screenshot: setup
	bash tests/setup/install-chromium.sh
	rm -rf $(DOCS_RUN) && mkdir -p $(DOCS_RUN)
	$(BIN)/artemis sim --scenario sim/scenarios/flagship.toml --rebalance apply \
		--jsonl $(DOCS_RUN)/findings.jsonl --plans-jsonl $(DOCS_RUN)/plans.jsonl
	$(BIN)/artemis report --findings $(DOCS_RUN)/findings.jsonl --out $(DOCS_RUN)
	$(BIN)/python -m artemis.report.browser $(DOCS_RUN)/flagship-sim.html docs/incident-report.png 1650

clean:
	rm -rf $(VENV) agent/_plugin job/_ext build *.egg-info
	$(MAKE) -C profiler_plugin clean
