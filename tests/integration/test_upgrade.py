"""Upgrading and uninstalling the chart on a fresh local control plane (docs/install.md).

- ``helm upgrade`` from the previous chart version (its files taken from git) to this one:
  Helm never upgrades ``crds/``, so the chart refuses to run against CRDs of a lower
  ``fencedlease.io/schema-revision``; the documented ``kubectl apply --server-side`` step
  upgrades them, objects stored under the old schema are still served, and a rollback of the
  release leaves the CRDs where they are (they only move forward);
- ``helm uninstall`` after the documented clean-up leaves no stuck object: leases and
  artifacts lose their finalizers while the operator runs, no webhook configuration stays
  behind to refuse writes, and what is kept on purpose (the CRDs, the status-signing key, the
  etcd data) is kept; objects stranded by an uninstall done first are freed by the documented
  finalizer patch.

No kubelet runs: the chart's Deployments never get Pods, so an in-process ``fencedlease run``
plays the controller and the webhook for one namespace, and the chart's own webhook
configuration selects only the release namespace (``watchNamespace``).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.local.cluster import LocalCluster

from .chart import CHART, ROOT, helm, kinds, one, render
from .k8s import (
    apply,
    get,
    lease,
    pod_lease_annotations,
    ready_pods,
    running_fence,
    wait_for,
    wait_held,
)

pytestmark = pytest.mark.timeout(420)

# The previous released chart version (before CRD upgrades were handled: crds/ only, no schema
# revision). On each release, move these to it: the schema-revision rule below compares with it.
PREVIOUS_COMMIT = "41d97457dfd7c2d94f810883196240f731092969"
PREVIOUS_VERSION = "0.1.0"
CRD_NAMES = ("fencedleases.fencedlease.io", "fencedartifacts.fencedlease.io")
REVISION = "fencedlease.io/schema-revision"
INSTALL_DOC = ROOT / "docs" / "install.md"
# The upgrade step exactly as docs/install.md writes it (checked below).
CRD_STEP = (
    "helm show crds charts/fencedlease | "
    "kubectl apply --server-side --force-conflicts --field-manager=fencedlease-crds -f -"
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane without CRDs: a cluster before the first ``helm install``."""
    with LocalCluster(tmp_path_factory.mktemp("fresh"), crds_dir=None) as running:
        yield running


def khelm(
    cluster: LocalCluster, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return helm("--kubeconfig", str(cluster.kubeconfig), *args, check=check)


def previous_chart(dest: Path) -> Path:
    """The chart (and the crds/ its symlink points to) at ``PREVIOUS_COMMIT``."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    assert known.returncode == 0, f"the upgrade test needs the git history ({PREVIOUS_COMMIT})"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_COMMIT, "charts/fencedlease", "crds"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    chart = dest / "charts" / "fencedlease"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == PREVIOUS_VERSION
    return chart


def crd(cluster: LocalCluster, name: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(cluster.kubectl("get", "crd", name, "-o", "json").stdout)
    return got


def revision(cluster: LocalCluster, name: str) -> str | None:
    annotations = crd(cluster, name)["metadata"].get("annotations") or {}
    return annotations.get(REVISION)


def shipped_revision(name: str) -> str:
    """The schema revision of this checkout's CRD ``name`` (``crds/``)."""
    manifest = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
    return str(manifest["metadata"]["annotations"][REVISION])


def apply_crds_as_documented(cluster: LocalCluster) -> None:
    shown = khelm(cluster, "show", "crds", str(CHART)).stdout
    kubectl = CRD_STEP.split(" | ", 1)[1].split()[1:]
    cluster.kubectl(*kubectl, input=shown)
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES)
    )


def create_namespace(cluster: LocalCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    return name


def release_values(release_ns: str) -> list[str]:
    # The chart's webhook configuration selects only the release namespace (no Pod serves it).
    return ["--set", f"watchNamespace={release_ns}"]


# ---------------------------------------------------------------------------- upgrade


def test_the_documented_crd_step_and_the_chart_check_agree() -> None:
    doc = INSTALL_DOC.read_text()
    assert CRD_STEP in doc
    check = (CHART / "templates" / "crds-check.yaml").read_text()
    assert "kubectl apply --server-side --force-conflicts --field-manager=fencedlease-crds" in check
    # Every CRD carries the revision the check compares, and a schema change raises it.
    for name in CRD_NAMES:
        current = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
        before = yaml.safe_load(
            subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{PREVIOUS_COMMIT}:crds/{name}.yaml"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        now = int(current["metadata"]["annotations"][REVISION])
        was = int(((before["metadata"].get("annotations") or {}).get(REVISION)) or 1)
        if current["spec"] != before["spec"]:
            assert now > was, f"{name}: the schema changed, raise {REVISION} (was {was})"


def test_upgrade_from_the_previous_chart_upgrades_the_crds_with_the_documented_step(
    fresh: LocalCluster, tmp_path: Path
) -> None:
    old_chart = previous_chart(tmp_path / "previous")
    release_ns = create_namespace(fresh, "rel")
    apps = create_namespace(fresh, "apps")
    release = f"fl-{uuid.uuid4().hex[:6]}"
    khelm(fresh, "install", release, str(old_chart), "-n", release_ns, *release_values(release_ns))
    for name in CRD_NAMES:  # created by Helm from the old chart's crds/
        assert revision(fresh, name) is None

    # Objects stored under the old schema, with a status as the 0.1.0 operator wrote it.
    apply(fresh, lease("report-july", apps, duration=15))
    old_status = {
        "phase": "Held",
        "holder": "w-a",
        "leaseId": "0194-old",
        "fencingToken": 41,
        "transitions": 1,
        "renewTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Held",
                "status": "True",
                "reason": "Granted",
                "message": "held by Pod w-a",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    fresh.kubectl(
        "patch", "fl", "report-july", "-n", apps, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": old_status}),
    )  # fmt: skip
    artifact = {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "catalog", "namespace": apps},
        "spec": {"leaseRef": {"name": "report-july"}, "fencingToken": 41, "objectRef": "r/b9"},
    }
    apply(fresh, artifact)

    # Without the CRD step the chart refuses, naming the step.
    refused = khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "helm upgrade ran the new chart against the old CRDs"
    needs = {f"needs {shipped_revision(name)}" for name in CRD_NAMES}
    assert "schema revision 1" in refused.stderr, refused.stderr
    assert any(n in refused.stderr for n in needs), refused.stderr
    assert "kubectl apply --server-side" in refused.stderr
    history = json.loads(khelm(fresh, "history", release, "-n", release_ns, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["deployed"]  # nothing was applied
    # A new install finds the CRDs present, so Helm would skip its crds/: refused as well.
    other_ns = create_namespace(fresh, "rel")
    second = khelm(
        fresh, "install", "second", str(CHART), "-n", other_ns, *release_values(other_ns),
        check=False,
    )  # fmt: skip
    assert second.returncode != 0 and "schema revision 1" in second.stderr, second.stderr

    # The installed release's CRDs brought to this chart's revision, but not the CRDs added
    # since (FencePolicy, FencedRelease, FencedClaim): Helm does not create them on upgrade and
    # the operator watches them, so the chart refuses, naming them. (The refused install above
    # created them: Helm installs the missing crds/ before it renders. Gone again here.)
    added = sorted({p.stem for p in (ROOT / "crds").glob("*.yaml")} - set(CRD_NAMES))
    assert added, "no CRD added since the previous chart: move PREVIOUS_COMMIT"
    fresh.kubectl("delete", "crd", *added, "--ignore-not-found", "--wait", "--timeout=60s")
    for name in CRD_NAMES:
        fresh.kubectl(
            *CRD_STEP.split(" | ", 1)[1].split()[1:-2], "-f", str(ROOT / "crds" / f"{name}.yaml")
        )
    refused = khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "helm upgrade ran the new chart without its new CRDs"
    assert "is not installed" in refused.stderr, refused.stderr
    assert all(name in refused.stderr for name in added), refused.stderr
    assert "kubectl apply --server-side" in refused.stderr
    history = json.loads(khelm(fresh, "history", release, "-n", release_ns, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["deployed"]  # nothing was applied

    apply_crds_as_documented(fresh)
    upgraded = khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values"
    )  # fmt: skip
    assert "has been upgraded" in upgraded.stdout
    (listed,) = json.loads(khelm(fresh, "list", "-n", release_ns, "-o", "json").stdout)
    chart_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert listed["chart"] == f"fencedlease-{chart_version}" and listed["revision"] == "2"
    for name in CRD_NAMES:
        assert revision(fresh, name) == shipped_revision(name)
    (version,) = crd(fresh, "fencedleases.fencedlease.io")["spec"]["versions"]
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Ready", "Lease ID", "Transitions", "Renewed"}
    # The release's values survived (--reset-then-reuse-values): watchNamespace still scopes
    # the webhook configuration.
    (config,) = webhooks_for(fresh, release_ns)
    hooks = json.loads(fresh.kubectl("get", config, "-o", "json").stdout)["webhooks"]
    assert [h["namespaceSelector"]["matchLabels"] for h in hooks] == [
        {"kubernetes.io/metadata.name": release_ns}
    ] * 3  # one entry per review kind, each on its own path
    assert [h["clientConfig"]["service"]["path"] for h in hooks] == [
        "/fence",
        "/fence-release",
        "/fence-claim",
    ]

    # From one unelected controller (Recreate) to two elected ones (RollingUpdate): the
    # upgraded release has the Deployment, and its service account may use the election Lease
    # it names (and no other Lease).
    check_elected_controllers(fresh, release_ns)

    # The old objects are served as they were, under the new schema.
    got = get(fresh, "fl", "report-july", apps)
    assert got is not None and got["status"]["leaseId"] == "0194-old"
    assert got["status"]["conditions"][0]["reason"] == "Granted"
    table = fresh.kubectl("get", "fl", "report-july", "-n", apps, "-o", "wide").stdout
    assert "0194-old" in table
    stored = get(fresh, "fa", "catalog", apps)
    assert stored is not None and stored["spec"]["fencingToken"] == 41
    # The new condition schema is in force: a malformed condition is refused now.
    bad = fresh.kubectl(
        "patch", "fl", "report-july", "-n", apps, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "lastTransitionTime: Required value" in bad.stderr

    # A rollback of the release does not move the CRDs back (Helm leaves crds/ alone)...
    khelm(fresh, "rollback", release, "1", "-n", release_ns)
    for name in CRD_NAMES:
        assert revision(fresh, name) == shipped_revision(name)
    # ...and upgrading again needs no CRD step.
    khelm(fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values")
    khelm(fresh, "uninstall", release, "-n", release_ns)


def check_elected_controllers(cluster: LocalCluster, namespace: str) -> None:
    (deployment,) = json.loads(
        cluster.kubectl(
            "get", "deployments", "-n", namespace, "-l", "app.kubernetes.io/component=controller",
            "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["type"] == "RollingUpdate", spec
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    election = env["FENCEDLEASE_LEADER_ELECTION_NAME"]
    assert env["FENCEDLEASE_LEADER_ELECTION_NAMESPACE"] == namespace
    account = f"system:serviceaccount:{namespace}:{pod['serviceAccountName']}"

    def can(verb: str, resource: str) -> bool:
        got = cluster.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False
        )
        return got.stdout.strip() == "yes"

    for verb in ("get", "update"):
        assert can(verb, f"leases.coordination.k8s.io/{election}"), verb
        assert not can(verb, "leases.coordination.k8s.io/someone-else"), verb
    assert can("create", "leases.coordination.k8s.io")


# -------------------------------------------------------------------------- uninstall


def release_objects(cluster: LocalCluster, release: str) -> list[str]:
    """Every object the release labelled, in any namespace (cluster-scoped ones too)."""
    names = cluster.kubectl(
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,"
        "clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"
        "poddisruptionbudgets,networkpolicies,persistentvolumeclaims",
        "-A",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
    ).stdout.split()
    return sorted(names)


def webhooks_for(cluster: LocalCluster, namespace: str) -> list[str]:
    """Admission configurations that call a Service in ``namespace``."""
    found = []
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        items = json.loads(cluster.kubectl("get", kind, "-o", "json").stdout)["items"]
        for item in items:
            for hook in item.get("webhooks") or []:
                service = (hook.get("clientConfig") or {}).get("service") or {}
                name = f"{kind}/{item['metadata']['name']}"
                if service.get("namespace") == namespace and name not in found:
                    found.append(name)  # once, whatever number of its entries call it
    return found


def uninstall_commands() -> list[list[str]]:
    """The clean-up commands of docs/install.md's "Uninstalling" block, in order."""
    section = INSTALL_DOC.read_text().split("## Uninstalling", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "docs/install.md: no sh block under Uninstalling"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def publish(cluster: LocalCluster, namespace: str, token: int) -> None:
    artifact = {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "catalog", "namespace": namespace},
        "spec": {"leaseRef": {"name": "report"}, "fencingToken": token, "objectRef": "r/1"},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(artifact))
    wait_for(
        lambda: (
            ((get(cluster, "fa", "catalog", namespace) or {}).get("status") or {}).get(
                "acceptedFence"
            )
            == token
        ),
        what="artifact accepted",
    )


def finalizers(cluster: LocalCluster, kind: str, name: str, namespace: str) -> list[str]:
    obj = get(cluster, kind, name, namespace) or {}
    return list((obj.get("metadata") or {}).get("finalizers") or [])


def test_uninstall_as_documented_leaves_no_stuck_object_and_keeps_the_data(
    fresh: LocalCluster, tmp_path: Path
) -> None:
    release_ns = create_namespace(fresh, "rel")
    apps = create_namespace(fresh, "apps")
    release = "fencedlease"  # the name the documented commands use
    khelm(fresh, "install", release, str(CHART), "-n", release_ns, *release_values(release_ns))
    before = release_objects(fresh, release)
    assert f"secret/{release}-authority" in before and len(before) > 10
    # No StatefulSet controller runs here: create the etcd member's PVC as it would (name from
    # the claim template, its labels), to see what uninstall does with the data.
    sts = one(render(release, release_ns), "StatefulSet", "-etcd")
    (template,) = sts["spec"]["volumeClaimTemplates"]
    pvc_name = f"{template['metadata']['name']}-{sts['metadata']['name']}-0"
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name,
            "namespace": release_ns,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    apply(fresh, pvc)
    assert webhooks_for(fresh, release_ns)

    commands = uninstall_commands()
    assert [c[:2] for c in commands] == [["kubectl", "delete"], ["helm", "uninstall"]]
    delete, uninstall = commands
    with running_fence(fresh, tmp_path, apps):  # the operator, still running
        ready_pods(fresh, apps, "w-a")
        apply(fresh, lease("report", apps, duration=30))
        token = wait_held(fresh, "report", apps)["fencingToken"]
        publish(fresh, apps, token)
        assert "fencedlease.io/high-water-mark" in finalizers(fresh, "fa", "catalog", apps)
        assert "fencedlease.io/finalizer" in finalizers(fresh, "fl", "report", apps)
        assert pod_lease_annotations(fresh, "w-a", apps, "report").get("state") == "held"

        # 1. While the operator runs, delete the leases and artifacts (docs: kubectl delete).
        fresh.kubectl(*delete[1:], "--timeout=60s", timeout=90)
        left = fresh.kubectl("get", "fencedleases,fencedartifacts", "-A", "-o", "name").stdout
        assert left.strip() == "", left
        wait_for(
            lambda: pod_lease_annotations(fresh, "w-a", apps, "report") == {},
            what="the holder's annotations cleaned by the lease finalizer",
        )

    # 2. helm uninstall (docs), with the release namespace of this test.
    args = uninstall[1:]
    args[args.index("-n") + 1] = release_ns
    khelm(fresh, *args, "--wait", "--timeout=60s")
    assert json.loads(khelm(fresh, "list", "-n", release_ns, "-o", "json").stdout) == []
    # Nothing of the release is left but the status-signing key and the etcd backups
    # (helm.sh/resource-policy: keep) and the etcd data (the StatefulSet's claim, which Helm
    # never created).
    assert release_objects(fresh, release) == [
        f"persistentvolumeclaim/{pvc_name}",
        f"persistentvolumeclaim/{release}-etcd-backup",
        f"secret/{release}-authority",
    ]
    # No webhook configuration is left to refuse writes (failurePolicy Fail) once nobody serves it.
    assert webhooks_for(fresh, release_ns) == []
    # Kept on purpose: the CRDs (Helm never deletes crds/), so a re-install finds the objects.
    for name in CRD_NAMES:
        conditions = {c["type"]: c["status"] for c in crd(fresh, name)["status"]["conditions"]}
        assert conditions["Established"] == "True"
        assert crd(fresh, name)["metadata"].get("deletionTimestamp") is None
    # The bundled etcd's data (tokens, high-water marks) lives in the StatefulSet's PVCs: the
    # chart renders no PVC of its own but the backups' (kept) and does not ask the StatefulSet
    # to delete them.
    (backups,) = kinds(render(release, release_ns), "PersistentVolumeClaim")
    assert backups["metadata"]["name"] == f"{release}-etcd-backup"
    assert backups["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    retention = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
    assert retention.get("whenDeleted", "Retain") == "Retain"
    assert retention.get("whenScaled", "Retain") == "Retain"


def test_objects_stranded_by_an_early_uninstall_are_freed_by_the_documented_patch(
    fresh: LocalCluster, tmp_path: Path
) -> None:
    apps = create_namespace(fresh, "strand")
    with running_fence(fresh, tmp_path, apps):
        ready_pods(fresh, apps, "w-a")
        apply(fresh, lease("report", apps, duration=30))
        publish(fresh, apps, wait_held(fresh, "report", apps)["fencingToken"])
    # The operator is gone (uninstalled first): deletion waits on its finalizers.
    fresh.kubectl("delete", "fa,fl", "--all", "-n", apps, "--wait=false")
    for kind, name in (("fa", "catalog"), ("fl", "report")):
        obj = get(fresh, kind, name, apps)
        assert obj is not None and obj["metadata"].get("deletionTimestamp"), (kind, obj)
        assert finalizers(fresh, kind, name, apps), f"{kind}/{name} has no finalizer"
    doc = INSTALL_DOC.read_text()
    patch = '{"metadata":{"finalizers":null}}'
    assert f"--type=merge -p '{patch}'" in doc
    for kind, name in (("fa", "catalog"), ("fl", "report")):
        fresh.kubectl("patch", kind, name, "-n", apps, "--type=merge", "-p", patch)
    wait_for(
        lambda: fresh.kubectl("get", "fa,fl", "-n", apps, "-o", "name").stdout.strip() == "",
        what="stranded objects gone",
    )
