# fencedlease — developer entry points. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit integration binaries postgres bench chaos e2e e2e-kind clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## Build etcd, etcdutl, kube-apiserver, kubectl and helm from Go modules (cached outside the repo).
## NODE=1 adds the node's: kubelet, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS.
binaries: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries $(if $(NODE),--node,)

## The main job: a local etcd + kube-apiserver + CRDs + webhook + operator, in the foreground.
## NODE=1 adds a real node (root): containerd, kubelet, kube-proxy, CoreDNS, controllers.
## With KUBECONFIG set, the operator runs against that cluster instead (fencedlease run).
run: $(STAMP)
	@if [ -n "$$KUBECONFIG" ]; then \
	  echo "KUBECONFIG is set: running the operator against $$KUBECONFIG" \
	       "(etcd: $${FENCEDLEASE_ETCD_ENDPOINTS:-http://127.0.0.1:2379}; unset KUBECONFIG for the local control plane)"; \
	  $(BIN)/fencedlease run; \
	else \
	  $(BIN)/python -m fencedlease.local.binaries $(if $(NODE),--node,) >/dev/null && \
	  $(BIN)/fencedlease local up $(if $(NODE),--node,) $(if $(STATE_DIR),--state-dir $(STATE_DIR),); \
	fi

## PostgreSQL server binaries for the SQL-fence tests (apt-get install postgresql when missing).
postgres:
	bash scripts/ensure-postgres.sh

lint: $(STAMP)
	$(BIN)/ruff check operator tests bench e2e examples
	$(BIN)/ruff format --check operator tests bench e2e examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict operator/fencedlease e2e examples tests

## All tests: lint, types, unit and integration (real etcd and kube-apiserver).
test: lint typecheck binaries postgres
	$(BIN)/pytest -q

## The fault campaign against the real system (docs/reliability.md): writes chaos-report/.
## PROFILE=short|full (default full), CHAOS_ARGS for --seed, --faults, --writes, --no-control.
chaos: $(STAMP) binaries
	$(BIN)/python -m tests.chaos.campaign --profile $(or $(PROFILE),full) $(CHAOS_ARGS)

## Side-by-side benchmark (docs/performance.md): raw etcd txn, etcd v3lock, aetcd Lock and the
## store's operations, interleaved in one run; then (about a minute) a kube-apiserver with the
## webhook: a client-go Lease, a plain CR PATCH, the fenced PATCH, the same PATCH through a
## webhook that checks nothing (the floor), 50 concurrent writers.
## BENCH_ARGS="-n 2000 --out DIR"; API=0 skips the API-server rows; LONG=1 adds the scheduler
## pass over 10,000 leases and the etcd soak (bench/etcd_soak.py, 50,000 handovers;
## SOAK_ARGS="--handovers N"). Then per-item claims (bench/claims.py, about a minute: claim
## latency p50/p99 and items/s; CLAIMS=0 skips it, CLAIMS_ARGS="--workers 10 --items 1000").
bench: $(STAMP) binaries
	$(BIN)/python bench/run.py $(if $(LONG),--long,) $(if $(filter 0,$(API)),--no-api,) $(BENCH_ARGS)
	$(if $(LONG),$(BIN)/python bench/etcd_soak.py $(SOAK_ARGS),)
	$(if $(filter 0,$(CLAIMS)),,$(BIN)/python bench/claims.py $(CLAIMS_ARGS))

## End to end on a real local node (root): node cluster, locally built images, helm install of
## charts/fencedlease, the e2e/ scenarios. Binaries and images are cached outside the repo.
e2e: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries --node >/dev/null
	$(BIN)/pytest -p no:cacheprovider -q e2e

e2e-kind:
	bash e2e/kind.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
