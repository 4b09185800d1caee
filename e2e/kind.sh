#!/usr/bin/env bash
# End-to-end on kind: build the image, helm install (bundled etcd, self-signed webhook certs),
# deploy 3 workers that read their token through the downward API and publish a FencedArtifact,
# then run the cluster-agnostic scenario (handover with a greater token, stale publish refused).
#
# Needs: docker, kind, helm, kubectl, python3 (the repo's .venv is used when present).
# Env: CLUSTER (default fencedlease-e2e), KEEP=1 keeps the cluster, IMAGE (default fencedlease:e2e).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER="${CLUSTER:-fencedlease-e2e}"
IMAGE="${IMAGE:-fencedlease:e2e}"
RELEASE=fencedlease
NS=fencedlease-system
KUBECONFIG_FILE="$(mktemp -t fencedlease-e2e-kubeconfig.XXXXXX)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

for tool in docker kind helm kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e/kind.sh: '$tool' is required" >&2; exit 2; }
done

cleanup() {
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "--- diagnostics ---" >&2
    kubectl --kubeconfig "$KUBECONFIG_FILE" get pods -A -o wide >&2 || true
    kubectl --kubeconfig "$KUBECONFIG_FILE" -n "$NS" logs -l app.kubernetes.io/instance=$RELEASE --all-containers --tail=80 >&2 || true
    kubectl --kubeconfig "$KUBECONFIG_FILE" -n fencedlease-e2e logs -l app=e2e-worker --tail=20 >&2 || true
    kubectl --kubeconfig "$KUBECONFIG_FILE" get fencedleases,fencedartifacts -A -o wide >&2 || true
  fi
  if [ "${KEEP:-0}" != 1 ]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -f "$KUBECONFIG_FILE"
  else
    echo "kept cluster $CLUSTER; kubeconfig: $KUBECONFIG_FILE" >&2
  fi
  exit "$status"
}
trap cleanup EXIT

echo "==> kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
export KUBECONFIG="$KUBECONFIG_FILE"

echo "==> docker build $IMAGE"
docker build -t "$IMAGE" --build-arg REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "==> helm install (bundled etcd, self-signed webhook certificate)"
helm upgrade --install "$RELEASE" "$ROOT/charts/fencedlease" \
  --namespace "$NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set etcd.bundled.enabled=true --set etcd.bundled.persistence.size=256Mi \
  --set webhook.tls.genSelfSigned=true \
  --set-json 'allowedWriters=["group:system:masters"]' \
  --wait --timeout 5m
kubectl -n "$NS" rollout status statefulset/"$RELEASE"-etcd --timeout=3m
kubectl -n "$NS" rollout status deployment/"$RELEASE"-controller --timeout=3m
kubectl -n "$NS" rollout status deployment/"$RELEASE"-webhook --timeout=3m

echo "==> workers"
kubectl apply -f "$ROOT/e2e/manifests/"
kubectl -n fencedlease-e2e rollout status deployment/e2e-worker --timeout=3m

echo "==> scenario"
cd "$ROOT"
"$PYTHON" -m e2e.scenarios --kubeconfig "$KUBECONFIG_FILE" --namespace fencedlease-e2e --kubectl "$(command -v kubectl)"
echo "==> e2e passed"
