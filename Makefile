# fencedlease — developer entry points. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit integration binaries postgres redis minio bench chaos e2e e2e-kind clean dist krew test-pythons release chart-readme go-test

$(STAMP): pyproject.toml client/pyproject.toml local/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./client -e '.[dev]' -e ./local
	@# An operator installed before the split owned bin/fencedlease: its upgrade removed it.
	@test -x $(BIN)/fencedlease || $(BIN)/python -m pip install --quiet --no-deps --force-reinstall -e ./client
	@touch $(STAMP)

## Build etcd, etcdutl, etcdctl, kube-apiserver, kubectl and helm from Go modules, take promtool from Debian (cached outside the repo).
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

## The article's race in one command, on a local control plane of its own (started and stopped):
## a frozen holder's write is refused with stale_fence; exit 0 when it is (docs/fenced-publish.md).
demo: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries >/dev/null
	$(BIN)/fencedlease local demo

## PostgreSQL server binaries for the SQL-fence tests (apt-get install postgresql when missing).
postgres:
	bash scripts/ensure-postgres.sh

## redis-server for the Redis-fence tests (apt-get install redis-server when missing).
redis:
	bash scripts/ensure-redis.sh

## MinIO, the S3 server of the S3-fence tests, built from its Go module (cached like etcd).
minio: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries minio >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check operator client local tests bench e2e examples scripts
	$(BIN)/ruff format --check operator client local tests bench e2e examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy --strict operator/fencedlease client/src/fencedlease/client client/krew \
	  local/src/fencedlease/local e2e examples tests scripts

## All tests: lint, types, the distributions, the client on its oldest and newest Python
## (test-pythons), the Go module (go-test), unit and integration (real etcd and kube-apiserver).
test: lint typecheck dist go-test test-pythons binaries postgres redis minio
	$(BIN)/pytest -q --durations=25

## The Go module (go/, docs/go.md): go vet and go test. Modules and builds stay in Go's own
## caches outside the repo (go env GOMODCACHE / GOCACHE, shared with the Go-built binaries):
## a warm run downloads nothing. -mod=readonly: go.mod and go.sum are not rewritten.
GO ?= go
## The example controller (examples/go-controller, its own module: a replace of ../../go) is
## vetted and tested too. `go mod download` fetches the modules from the proxy on a cold cache.
go-test:
	cd go && $(GO) mod download
	cd go && GOFLAGS="-mod=readonly -buildvcs=false" $(GO) vet ./...
	cd go && GOFLAGS="-mod=readonly -buildvcs=false" $(GO) test -count=1 ./...
	cd examples/go-controller && GOFLAGS="-mod=readonly -buildvcs=false" $(GO) vet ./...
	cd examples/go-controller && GOFLAGS="-mod=readonly -buildvcs=false" $(GO) test -count=1 ./...

## The wheel and sdist of both distributions (fencedlease-client from client/, the operator
## fencedlease from .) in DIST (default dist/), their metadata checked with twine.
DIST ?= dist
dist: $(STAMP)
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) client
	$(BIN)/python -m build --outdir $(DIST) .
	$(BIN)/python -m build --outdir $(DIST) local
	$(BIN)/twine check --strict $(DIST)/*

## The krew archive of `kubectl fencedlease` (one archive for Linux and macOS on amd64 and
## arm64: the client and its dependencies as pure Python, installed by the oldest supported
## Python's pip, run by python3 >= 3.9) and its manifest with the archive's sha256, in
## $(DIST)/krew.
krew: $(STAMP)
	@test -n "$(PYTHON_OLDEST)" || { echo "krew: no Python 3.9 (see make test-pythons)"; exit 1; }
	$(BIN)/python client/krew/build.py --out $(DIST)/krew --python $(PYTHON_OLDEST)

## A release of VERSION (x.y.z; CHANGELOG.md needs its section) into OUT (default
## dist/release-VERSION): wheels and sdists, the chart .tgz, the operator image (OCI archive and
## digest), its CycloneDX SBOM, the krew archive and manifest, RELEASE_NOTES.md, SHA256SUMS.
## KEY=uid KEYRING=secring.gpg [GNUPGHOME=dir] sign the chart (.prov) and SHA256SUMS.asc
## (docs/release.md). Builds the image like `make e2e` (root, buildah; cached). The krew archive's
## lib/ is installed by PYTHON_OLDEST (below); a release without Python 3.9 stops, saying so.
release: $(STAMP)
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z [OUT=dir] [KEY=uid KEYRING=secring.gpg]"; exit 2; }
	$(BIN)/python scripts/release.py --version $(VERSION) --out $(or $(OUT),$(DIST)/release-$(VERSION)) \
	  $(if $(KEY),--key '$(KEY)' --keyring $(KEYRING),) $(if $(GNUPGHOME),--gnupghome $(GNUPGHOME),) \
	  $(if $(PYTHON_OLDEST),--python-oldest $(PYTHON_OLDEST),)

## charts/fencedlease/README.md from the values' comments (a test fails when it is stale).
chart-readme: $(STAMP)
	$(BIN)/python scripts/chart_readme.py

## The client's own tests (its unit tests and the SQL-fence tests) on the oldest and the newest
## Python it supports (docs/client.md): each in its own venv (.venv-X.Y) holding only the
## client distribution. PYTHON_OLDEST / PYTHON_NEWEST default to the newest 3.9.x and 3.13.x
## under ~/.pyenv/versions, else python3.9 / python3.13 on PATH; a missing one FAILS, saying
## how to get it. The first run makes the venvs (pip); later runs only test.
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON_OLDEST ?= $(firstword $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/3.9.*/bin/python3.9))) $(shell command -v python3.9))
PYTHON_NEWEST ?= $(firstword $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/3.13.*/bin/python3.13))) $(shell command -v python3.13))
CLIENT_TESTS = tests/unit/test_client.py tests/unit/test_client_input.py \
  tests/unit/test_client_kubeconfig.py tests/unit/test_client_fenced.py \
  tests/unit/test_client_paths.py tests/unit/test_kubectl_plugin.py \
  tests/unit/test_client_sources.py \
  tests/integration/test_client_sql.py
test-pythons: postgres
	@for want in "3.9:$(PYTHON_OLDEST)" "3.13:$(PYTHON_NEWEST)"; do \
	  v=$${want%%:*}; p=$${want#*:}; \
	  if test -z "$$p" || ! "$$p" -c 'import sys' >/dev/null 2>&1; then \
	    echo "test-pythons: no Python $$v found (looked in $(PYENV_ROOT)/versions/$$v.* and for python$$v on PATH)."; \
	    echo "  get it: pyenv install $$v (https://github.com/pyenv/pyenv), or your OS package python$$v;"; \
	    echo "  or name one: make test-pythons PYTHON_OLDEST=/path/to/python3.9 PYTHON_NEWEST=/path/to/python3.13"; \
	    exit 1; \
	  fi; \
	done
	@for p in $(PYTHON_OLDEST) $(PYTHON_NEWEST); do \
	  v=$$($$p -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "== Python $$v ($$p)"; \
	  test -x .venv-$$v/bin/python || $$p -m venv .venv-$$v || exit 1; \
	  test .venv-$$v/.installed -nt client/pyproject.toml || { \
	    .venv-$$v/bin/python -m pip install --quiet -e './client[postgres]' 'pytest>=8,<10' \
	      'pytest-timeout>=2.3,<3' 'pytest-asyncio>=0.23,<2' && touch .venv-$$v/.installed; } || exit 1; \
	  .venv-$$v/bin/python -m pytest -q -rs -p no:cacheprovider --noconftest \
	    $(CLIENT_TESTS) || exit 1; \
	done

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
## SOAK_ARGS="--handovers N"). Then each fence against the same unfenced write (bench/fences.py,
## docs/fences.md; FENCES_ARGS="-n 300") and per-item claims (bench/claims.py, about a minute:
## claim latency p50/p99 and items/s; CLAIMS=0 skips it, CLAIMS_ARGS="--workers 10 --items 1000").
## Last, a Go controller's fenced Update against its plain one through a kube-apiserver with the
## webhook (bench/go_client.py, docs/go.md; GO_BENCH_ARGS="-n 300").
bench: $(STAMP) binaries postgres redis minio
	$(BIN)/python bench/run.py $(if $(LONG),--long,) $(if $(filter 0,$(API)),--no-api,) $(BENCH_ARGS)
	$(BIN)/python bench/fences.py $(FENCES_ARGS)
	$(if $(LONG),$(BIN)/python bench/etcd_soak.py $(SOAK_ARGS),)
	$(if $(filter 0,$(CLAIMS)),,$(BIN)/python bench/claims.py $(CLAIMS_ARGS))
	$(BIN)/python bench/go_client.py $(GO_BENCH_ARGS)

## End to end on a real local node (root): node cluster, locally built images, helm install of
## charts/fencedlease, the e2e/ scenarios. Binaries and images are cached outside the repo.
## The chart module installs `make release`'s chart and image from a loopback OCI registry
## (crane, built here once: ~2.5 min cold) by digest (e2e/registry_release.py).
e2e: $(STAMP)
	$(BIN)/python -m fencedlease.local.binaries --node >/dev/null
	$(BIN)/python -m fencedlease.local.binaries crane >/dev/null
	$(BIN)/pytest -p no:cacheprovider -q --durations=15 e2e

e2e-kind:
	bash e2e/kind.sh

clean:
	rm -rf $(VENV) .venv-3.* dist .mypy_cache .pytest_cache .ruff_cache
