# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= test,gpu,dashboards,fuse,stacks,plot,frameworks

.PHONY: setup system demo test test-cost test-frameworks test-lab test-newcomer test-composer test-compat test-fast lint bench fuzz soak scale generate eval clean

$(VENV)/.installed: pyproject.toml tests/deploy/package-lock.json
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: this machine has the CPU build on disk; an open range would pull CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	# CRD-schema validators for the deploy tests (Prometheus Operator objects), from npm.
	if command -v npm >/dev/null; then npm ci --prefix tests/deploy --no-audit --no-fund --silent; fi
	touch $@

setup: $(VENV)/.installed

system:
	scripts/install-system-deps

demo: setup system
	$(VENV)/bin/stallscope demo

# The framework integrations' real training runs (Lightning DDP, Hugging Face) take minutes
# each: `make test-frameworks`; the live runs of lab scenarios that are another setting of
# a fault CI runs live (tests/lab/test_scenarios_e2e.py VARIANTS): `make test-lab`. Both
# are kept out of `make test` (CI) so the suite stays under 25 min on 2 cores; the slowest
# tests are listed at the end of each run.
test: setup system lint
	$(PY) -m pytest -q -ra -m 'not frameworks and not lab_variant and not newcomer' --durations=30

# the loaders' extra (pyproject.toml) only here: CI would pay its install time. litdata
# pulls torchvision, and with it a CUDA torch: torch 2.13.0 goes back, torchvision goes.
$(VENV)/.loaders: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[loaders]'
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip uninstall -q -y torchvision
	touch $@

test-frameworks: setup system $(VENV)/.loaders
	$(PY) -m pytest -q -ra -m frameworks

test-lab: setup system
	$(PY) -m pytest -q -ra tests/lab/test_scenarios_e2e.py tests/lab/test_nodes.py tests/lab/test_nodes_scenarios.py tests/lab/test_cleanup.py tests/lab/test_draws.py tests/newcomer

# The scripted first hour of a new user (issue 52): the README's demo, `stallscope run`
# under a progress bar in an 80-column terminal, the predicted fix and compare, diagnose
# just after a job ended, report and top on one period. ~6 minutes; not in `make test`.
test-newcomer: setup system
	$(PY) -m pytest -q -ra tests/newcomer

# Scenarios drawn at random (docs/lab.md, issue 49): EVAL_COUNT fresh draws of every fault
# class from EVAL_SEED (default: seeds from the clock, new each time), each run live (~40 s
# a draw on 2 cores, 11 classes a count; root for most classes, the others are skipped
# with the reason) and recorded into EVAL_DIR; then every recorded draw replayed through
# the analysis (seconds). Both print the table per class. Not in CI.
EVAL_COUNT ?= 1
EVAL_SEED ?= $(shell date +%s)
EVAL_DIR ?= tests/data/draws
eval: setup system
	@status=0; \
	$(VENV)/bin/stallscope lab sample --seed $(EVAL_SEED) --class all --count $(EVAL_COUNT) --record $(EVAL_DIR) || status=$$?; \
	echo; $(PY) -m stallscope.lab.draws --detail $(EVAL_DIR) || status=$$?; \
	exit $$status

# MosaicML Composer and Streaming in a virtualenv of their own: mosaicml 0.32 requires
# torch<2.7.1 and streaming imports torchvision, neither of which fits the main venv's
# CPU torch 2.13 (docs/integrations.md). torch 2.7.0 + torchvision 0.22.0 from PyPI are
# CUDA builds (~5 GB, a long first download) that run on the CPU. Never part of `make test`.
COMPOSER_VENV ?= .venv-composer
COMPOSER_PY := $(COMPOSER_VENV)/bin/python

$(COMPOSER_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(COMPOSER_VENV)
	# pinned first, as in setup: an open range would resolve torch to whatever is newest
	$(COMPOSER_PY) -m pip install -q torch==2.7.0 torchvision==0.22.0
	$(COMPOSER_PY) -m pip install -q -e '.[composer]'
	touch $@

test-composer: $(COMPOSER_VENV)/.installed
	$(COMPOSER_PY) -m pytest -q -ra tests/integrations/test_composer.py tests/hook/test_shards.py -k 'composer or streaming'

# Not in CI: the hook against the torch releases users run, one venv each under .compat/
# (torch pinned first, then this checkout; PyPI's Linux wheels are CUDA builds, ~3 GB a
# release, that run on the CPU; installed past any machine-wide pip constraint), each running
# tests/hook and scripts/compat_probe.py (settings, worker PIDs, the ready/transfer split),
# and the hook's standard-library path under pyenv's Pythons 3.9-3.13 (`python -S`).
# Prints a table; .compat/results.json. Fewer: `make test-compat TORCH_COMPAT="2.8.0"`;
# COMPAT_CLEAN=1 removes the venvs afterwards.
TORCH_COMPAT ?= 2.4.1 2.8.0 2.11.0 2.13.0 2.15.0
test-compat: setup
	$(PY) scripts/compat.py --torch $(TORCH_COMPAT) $(if $(COMPAT_CLEAN),--clean)

test-fast: setup
	$(PY) -m pytest -q -ra -m 'not slow'

# ruff on the whole repository; mypy --strict on [tool.mypy] files in pyproject.toml (the
# hook), against Python 3.9, the oldest it runs on, and on the agent, the correlator and
# diagnose at the venv's Python.
# `test` depends on it: CI runs `make test`, so a lint finding fails CI like a test does.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy --python-version 3.9
	$(PY) -m mypy -p stallscope.agent -p stallscope.correlate -p stallscope.diagnose -p stallscope.fleet

# Short options, a few minutes in all: bench_diagnose.py --quick (a 20 s window; ~80 s
# with its default 60 s window), bench_agent.py for 10 s a load and without the
# detection rounds (the full run, 60 s a load and detection of three stalls:
# `$(PY) benchmarks/bench_agent.py`).
bench: setup
	for b in benchmarks/bench_*.py; do \
	  case $$b in \
	    */bench_agent.py) args="--seconds 10 --skip-detection";; \
	    */bench_diagnose.py) args="--quick";; \
	    *) args="";; \
	  esac; \
	  $(PY) $$b $$args || exit 1; \
	done

# Not in CI (~2.5 min, a real 8 ranks x 8 DataLoader workers load): the cost gate. Fails
# when the agent's steady cost is over 2 % of one core or the eight stalls' onset over 8 %
# (benchmarks/bench_agent.py BUDGET_*; docs/design.md "What keeps the agent cheap" lists
# the mechanisms that keep it there). A percentage of a core drifts with a shared machine's
# load: run it on a quiet one, or twice.
test-cost: setup
	$(PY) benchmarks/bench_agent.py --gate --seconds 60

# Not in CI: a million hostile messages against a real agent (~15 min), and 30 minutes of
# 8 ranks x 8 DataLoader workers printing the agent's RSS over time.
fuzz: setup system
	STALLSCOPE_FUZZ_MESSAGES=1000000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 tests/agent/test_fuzz.py

soak: setup
	$(PY) benchmarks/soak_agent.py --minutes 31

# Not in CI: the scale rig (benchmarks/scale/rig.py), 2,048 and 8,192 ranks (8 a node) on
# one Prometheus and on two sharding vmagents + victoria-metrics + vmalert, 4-8 minutes a
# run; it appends to benchmarks/scale/results.jsonl and prints the table of docs/deploy.md.
# 16,384 ranks: `$(PY) benchmarks/scale/rig.py --ranks 16384` (GiBs of memory).
scale: setup system
	$(PY) benchmarks/scale/rig.py --ranks 2048 8192

# Dashboards, rules and the PrometheusRule come from stallscope/mixin, the metric/signal/
# cause reference and the exporter table of the docs from stallscope/vocabulary, the
# golden /metrics from a real agent over the golden node (tests/golden/fixtures/node.py);
# CI fails when the checked-in files differ from what they generate.
generate: setup
	$(VENV)/bin/stallscope alerts --out alerts --prometheusrule deploy/kubernetes/base/prometheusrule.yaml \
	  --inhibit-rules deploy/alertmanager/inhibit-rules.yaml \
	  --alertmanagerconfig deploy/kubernetes/examples/alertmanagerconfig.yaml
	$(VENV)/bin/stallscope dashboards --out dashboards
	$(PY) -m stallscope.vocabulary.reference docs
	# the golden exposition and signal table: the agent over the golden node's tree
	$(PY) -m pytest -q -p no:cacheprovider tests/golden --update

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
