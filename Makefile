# fencedlease — developer entry points. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit integration binaries postgres bench e2e-kind clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## Build etcd, etcdutl, kube-apiserver, kubectl and helm from Go modules (cached outside the repo).
binaries: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries

## The main job: a local etcd + kube-apiserver + CRDs + webhook + operator, in the foreground.
## With KUBECONFIG set, the operator runs against that cluster instead (fencedlease run).
run: $(STAMP)
	@if [ -n "$$KUBECONFIG" ]; then \
	  echo "KUBECONFIG is set: running the operator against $$KUBECONFIG" \
	       "(etcd: $${FENCEDLEASE_ETCD_ENDPOINTS:-http://127.0.0.1:2379}; unset KUBECONFIG for the local control plane)"; \
	  $(BIN)/fencedlease run; \
	else \
	  $(BIN)/python -m fencedlease.local.binaries >/dev/null && \
	  $(BIN)/fencedlease local up $(if $(STATE_DIR),--state-dir $(STATE_DIR),); \
	fi

## PostgreSQL server binaries for the SQL-fence tests (apt-get install postgresql when missing).
postgres:
	bash scripts/ensure-postgres.sh

lint: $(STAMP)
	$(BIN)/ruff check operator tests bench e2e examples
	$(BIN)/ruff format --check operator tests bench e2e examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict operator/fencedlease

## All tests: lint, types, unit and integration (real etcd and kube-apiserver).
test: lint typecheck binaries postgres
	$(BIN)/pytest -q

bench: $(STAMP) binaries
	$(BIN)/python bench/run.py

e2e-kind:
	bash e2e/kind.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
