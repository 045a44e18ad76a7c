# ShardMeter — `make demo` and `make test` each create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
OUT    ?= out/case-study
# Test files spread over the cores (pytest-xdist; a file's tests stay in one worker, in order;
# tests/kube/ is one unit — one real control plane for all of its tests: tests/conftest.py).
# JOBS=0 runs everything in one process.
JOBS   ?= auto
XDIST  := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --maxprocesses 4 --dist loadfile)

.PHONY: demo test check lint typecheck pytest crds docs bench clean tools kube cluster

# Core install: the model, simulator, optimizer and CLI (no torch, no kopf).
$(VENV)/.core: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# Full install for tests: torch 2.13.0 first (PyPI's build, CUDA included; it runs on the CPU —
# this machine has no GPU and no local CPU-only wheel), then every extra, then torchtitan without
# its declared dependencies (the `torchtitan` extra lists the ones it needs; the Dockerfile pins
# the same). torch's build pulls triton into site-packages; it is removed there: torch.profiler
# imports triton whenever it can, and that skews the benchmark Job's CPU timings. torchtitan's
# models import triton, so it goes to $(TRITON_SITE), outside site-packages, and only the
# processes that run torchtitan put it on PYTHONPATH.
TORCHTITAN_VERSION := 0.3.0
TRITON_SITE := $(VENV)/triton-site
$(VENV)/.full: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[operator,bench,dev,torchtitan]'
	$(PIP) install --no-deps torchtitan==$(TORCHTITAN_VERSION)
	$(PIP) uninstall -y triton
	$(PIP) install --no-deps --upgrade --target $(TRITON_SITE) triton==3.9.0
	$(PY) -c "import torch; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
	touch $(VENV)/.core $@

# Tools the tests call that PyPI does not ship: promtool (alert-rule tests) is unpacked from
# Debian's `prometheus` package into the venv — no service installed or started, nothing
# system-wide (a promtool already on PATH is linked instead). hadolint comes with the dev extra.
$(VENV)/bin/promtool: | $(VENV)/.full
	@set -e; if command -v promtool >/dev/null 2>&1; then ln -sf "$$(command -v promtool)" $@; else \
	  tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cd "$$tmp"; \
	  apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; \
	  dpkg-deb -x prometheus_*.deb x; cp x/usr/bin/promtool $(CURDIR)/$@; fi
	@$@ --version | head -1

tools: $(VENV)/bin/promtool

# The real control plane of tests/kube/ — etcd, kube-apiserver, kube-controller-manager, the
# JobSet controller, Kueue's manager (versions: tools/kube/versions.env) — built from their Go
# modules into $(KUBE_CACHE) once per machine (cold: see tools/kube/README.md); afterwards this
# only checks that each is there.
KUBE_CACHE ?= $(HOME)/.cache/shardmeter/kube
kube:
	@SHARDMETER_KUBE_CACHE=$(KUBE_CACHE) tools/kube/build.sh

# A real control plane with JobSet and Kueue for a person: prints `export KUBECONFIG=…`; Ctrl-C
# stops every process.
cluster: kube $(VENV)/.full
	cd tests && SHARDMETER_KUBE_CACHE=$(KUBE_CACHE) ../$(PY) -m support.realkube $(CLUSTER_ARGS)

demo: $(VENV)/.core
	$(VENV)/bin/shardmeter plan examples/case-study.yaml --out $(OUT)
	@echo
	@echo "Pictures and trace written to $(OUT)/ (frontier.png, top20.png, timeline.png, trace.json — open the trace in https://ui.perfetto.dev)"

lint: $(VENV)/.full
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check shardmeter operator bench-job tests
	$(VENV)/bin/mypy shardmeter operator/shardmeter_operator bench-job/shardmeter_bench bench-job/shardmeter_torchtitan
	$(VENV)/bin/lint-imports --no-cache

pytest: $(VENV)/.full tools kube
	SHARDMETER_KUBE_CACHE=$(KUBE_CACHE) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test: lint pytest

# The inner loop: lint, then every test not marked slow (the bench and launch end-to-end runs,
# the exhaustive planner cross-check), stopping at the first failure. `make test` runs them all.
check: lint $(VENV)/.full tools kube
	SHARDMETER_KUBE_CACHE=$(KUBE_CACHE) $(PY) -m pytest $(XDIST) -m "not slow" -x -q $(PYTEST_ARGS)

crds: $(VENV)/.full
	$(PY) -m shardmeter_operator.api.crdgen crds

# docs/reference/*.md and the chart README's tables, from the models, values.yaml, the alerts
# and the RBAC declaration; the command outputs README.md and docs/*.md show (console blocks,
# tools/docoutputs.py). tests/test_docs.py fails when any of them drifts.
docs: $(VENV)/.full
	$(PY) tools/gendocs.py docs/reference
	$(PY) tools/docoutputs.py

bench: $(VENV)/.core
	$(PY) benchmarks/bench_simulator.py
	$(PY) benchmarks/bench_optimizer.py

clean:
	rm -rf $(VENV) out build *.egg-info
