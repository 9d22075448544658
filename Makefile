# One entry point for humans and CI. `make test` builds its own virtualenv, so a fresh
# clone needs nothing but python3 (>= 3.11), java (Pub/Sub emulator) and gcloud.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install lint typecheck test unit demo demo-basic sandbox-up kube-bins test-matrix test-stress bench lock clean

$(STAMP): pyproject.toml
	$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "python >= 3.11 required"'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# checkov pins packaging/dateutil versions that clash with the runtime deps, so it gets its own venv.
CHECKOV := .venv-checkov/bin/checkov
$(CHECKOV):
	$(PY) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install -q checkov

typecheck: install
	$(BIN)/mypy shared functions tpuprov sandbox

# The sandbox's real Kubernetes components (sandbox/kube/go: etcd, kube-apiserver, scheduler,
# controller manager, KWOK, JobSet, Kueue), built into sandbox/kube/bin only when their pins change.
kube-bins: install
	$(BIN)/python -m sandbox.kube.build

# The README's test command: lint (with the import contracts), types, then the whole pytest suite
# (tests/sandbox/real starts the real control plane, so its binaries are built first). Two workers,
# a test file each at a time (its module-scoped control plane stays in one worker): the real-stack
# tests mostly wait on real components, so two halve the wall time on the 2-core machines.
PYTEST_WORKERS ?= 2
test: lint typecheck $(CHECKOV) kube-bins
	CHECKOV_BIN=$(CURDIR)/$(CHECKOV) $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

unit: install
	$(BIN)/pytest -m "not integration"

# The README's "run it" command: the Kueue multislice tutorial flow on the real Kubernetes
# components (kube-bins is a no-op when the pins are unchanged; root, for a loopback-only netns).
demo: install kube-bins
	$(BIN)/tpuprov demo

# One TPU and one CPU JobSet, no Kueue.
demo-basic: install kube-bins
	$(BIN)/tpuprov demo --scenario basic

# The same stack kept up until Ctrl-C; prints the exports and the prefix kubectl needs.
sandbox-up: install kube-bins
	$(BIN)/tpuprov sandbox up

# The product on every supported JobSet x Kueue pair and the upgrade of an older cluster, on the real
# components (docs/sandbox.md "Version matrix"): the other versions' controllers and manifests are built
# first into sandbox/kube/bin/versions (once, then only when their pins change; one compile job and one
# thread: `make test` may run beside it), then each test file in one process. Not part of `make test`.
test-matrix: install kube-bins
	GOMAXPROCS=1 $(BIN)/python -m sandbox.kube.build --all-versions
	TPUPROV_VERSION_MATRIX=1 $(BIN)/pytest tests/sandbox/real/test_version_matrix.py
	TPUPROV_VERSION_MATRIX=1 $(BIN)/pytest tests/sandbox/real/test_addon_upgrade.py

# The real-stack tests under CPU starvation, repeated (docs/sandbox.md "Stress"): the whole run, both
# workers and every component they start (etcd, API server, controllers, Kueue, JobSet, the functions),
# pinned to one core, STRESS_RUNS times; the slowest tests are listed at the end of each run.
# Not part of `make test`.
STRESS_RUNS ?= 2
test-stress: install kube-bins
	for run in $$(seq $(STRESS_RUNS)); do \
	  echo "== stress run $$run of $(STRESS_RUNS): tests/sandbox/real on one core"; \
	  taskset -c 0 $(BIN)/pytest -p no:cacheprovider -n 2 --dist loadfile --durations=15 tests/sandbox/real \
	    || exit 1; \
	done

bench: install
	$(BIN)/tpuprov bench

# The function image's lock (infra/image/requirements.lock): [project].dependencies resolved to exact
# versions with the sha256 of every file; run it after changing them (needs PyPI). pip-tools gets a
# throwaway virtualenv so the dev one stays as `install` made it.
lock:
	$(PY) -m venv build/pip-tools
	build/pip-tools/bin/python -m pip install -q pip-tools
	build/pip-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
		--no-emit-index-url --no-emit-find-links --output-file=infra/image/requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
