"""Upgrading and uninstalling the chart on a fresh local control plane (docs/install.md).

- ``helm upgrade`` from the previous chart version (its files taken from git, CRDs in Helm's
  ``crds/``) to this one, whose ``templates/crds.yaml`` installs and upgrades the CRDs: the
  first upgrade takes them over (``--take-ownership``, once) and brings them to this chart's
  ``fencedlease.io/schema-revision`` with no kubectl step; objects stored under the old schema
  are still served; a later chart's CRD change is applied by a plain ``helm upgrade``; a
  rollback and an uninstall leave the CRDs in place (``helm.sh/resource-policy: keep``);
- with ``crds.enabled=false`` the chart refuses to run against older CRDs, naming the step
  that applies them;
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
import shutil
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

# The previous released chart version (CRDs in Helm's crds/, no schema revision). On each
# release, move these to it: the schema-revision rule below compares with it.
PREVIOUS_COMMIT = "41d97457dfd7c2d94f810883196240f731092969"
PREVIOUS_VERSION = "0.1.0"
CRD_NAMES = ("fencedleases.fencedlease.io", "fencedartifacts.fencedlease.io")
REVISION = "fencedlease.io/schema-revision"
INSTALL_DOC = ROOT / "docs" / "install.md"
# The first upgrade from a chart that installed the CRDs from crds/, as docs/install.md writes it.
TAKE_OVER = "helm upgrade fencedlease fencedlease/fencedlease -n fencedlease --take-ownership"
# With crds.enabled=false, the CRD step as docs/install.md and templates/crds-check.yaml write it.
CRD_APPLY = "kubectl apply --server-side --force-conflicts --field-manager=fencedlease-crds -f -"


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


def create_namespace(cluster: LocalCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    return name


def release_values(release_ns: str) -> list[str]:
    # The chart's webhook configuration selects only the release namespace (no Pod serves it).
    return ["--set", f"watchNamespace={release_ns}"]


# ---------------------------------------------------------------------------- upgrade


def test_the_documented_crd_steps_and_the_chart_agree() -> None:
    doc = INSTALL_DOC.read_text()
    assert TAKE_OVER in doc and CRD_APPLY in doc
    assert CRD_APPLY in (CHART / "templates" / "crds-check.yaml").read_text()
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


def history(cluster: LocalCluster, release: str, namespace: str) -> list[str]:
    got = json.loads(khelm(cluster, "history", release, "-n", namespace, "-o", "json").stdout)
    return [h["status"] for h in got]


def later_chart(dest: Path, name: str) -> Path:
    """This chart with real copies of its CRDs, ``name``'s at the next schema revision and with
    one more printer column: the next release's chart."""
    chart = dest / "fencedlease"
    shutil.copytree(CHART, chart, symlinks=False)
    path = chart / "files" / "crds" / f"{name}.yaml"
    manifest = yaml.safe_load(path.read_text())
    annotations = manifest["metadata"]["annotations"]
    annotations[REVISION] = str(int(annotations[REVISION]) + 1)
    (version,) = manifest["spec"]["versions"]
    version["additionalPrinterColumns"].append(
        {"name": "Next", "type": "string", "jsonPath": ".metadata.name", "priority": 1}
    )
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return chart


def test_upgrade_from_the_previous_chart_takes_over_and_upgrades_the_crds(
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

    # The old chart's CRDs belong to no release: Helm refuses to take them over unasked, and
    # nothing is applied.
    refused = khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "helm upgrade took over CRDs it does not own"
    assert "CustomResourceDefinition" in refused.stderr, refused.stderr
    assert "invalid ownership metadata" in refused.stderr, refused.stderr
    assert history(fresh, release, release_ns)[-1] == "deployed"
    for name in CRD_NAMES:
        assert revision(fresh, name) is None

    # The documented first upgrade: the chart takes the CRDs over and upgrades them, creates
    # the ones added since (FencePolicy, FencedRelease, FencedClaim); no kubectl step.
    khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values",
        "--take-ownership",
    )  # fmt: skip
    (listed,) = json.loads(khelm(fresh, "list", "-n", release_ns, "-o", "json").stdout)
    chart_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert listed["chart"] == f"fencedlease-{chart_version}" and listed["revision"] == "2"
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert revision(fresh, path.stem) == shipped_revision(path.stem)
        annotations = crd(fresh, path.stem)["metadata"]["annotations"]
        assert annotations["meta.helm.sh/release-name"] == release
        assert annotations["helm.sh/resource-policy"] == "keep"
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

    # The next chart's CRD change arrives with a plain helm upgrade.
    name = "fencedleases.fencedlease.io"
    nxt = later_chart(tmp_path / "next", name)
    khelm(fresh, "upgrade", release, str(nxt), "-n", release_ns, "--reset-then-reuse-values")
    assert revision(fresh, name) == str(int(shipped_revision(name)) + 1)
    (version,) = crd(fresh, name)["spec"]["versions"]
    assert "Next" in {c["name"] for c in version["additionalPrinterColumns"]}

    # A rollback to the old chart (no CRDs in its release) leaves them in place (keep)...
    khelm(fresh, "rollback", release, "1", "-n", release_ns)
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert crd(fresh, path.stem)["metadata"].get("deletionTimestamp") is None
    assert revision(fresh, name) == str(int(shipped_revision(name)) + 1)
    assert get(fresh, "fl", "report-july", apps) is not None
    # ...an upgrade to a chart with older CRDs is refused rather than narrowing them...
    older = khelm(
        fresh, "upgrade", release, str(CHART), "-n", release_ns, "--reset-then-reuse-values",
        check=False,
    )  # fmt: skip
    assert older.returncode != 0 and "does not narrow a CRD" in older.stderr, older.stderr
    assert revision(fresh, name) == str(int(shipped_revision(name)) + 1)
    # ...and upgrading again needs no step: the release still owns them.
    khelm(fresh, "upgrade", release, str(nxt), "-n", release_ns, "--reset-then-reuse-values")
    khelm(fresh, "uninstall", release, "-n", release_ns)
    for path in sorted((ROOT / "crds").glob("*.yaml")):  # kept (crds.keep)
        assert crd(fresh, path.stem)["metadata"].get("deletionTimestamp") is None
    assert get(fresh, "fl", "report-july", apps) is not None
    # The tests below install this chart again: its revision back (the "next" chart was made up).
    fresh.kubectl("annotate", "crd", name, f"{REVISION}={shipped_revision(name)}", "--overwrite")


def test_with_crds_disabled_the_chart_refuses_older_or_missing_crds(
    fresh: LocalCluster,
) -> None:
    name = "fencedleases.fencedlease.io"
    release_ns = create_namespace(fresh, "rel")
    release = f"fl-{uuid.uuid4().hex[:6]}"
    flags = ["-n", release_ns, "--set", "crds.enabled=false", *release_values(release_ns)]
    if not crd_exists(fresh, name):  # run alone: the CRDs as a user applies them
        fresh.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    fresh.kubectl("annotate", "crd", name, f"{REVISION}=1", "--overwrite")
    try:
        refused = khelm(fresh, "install", release, str(CHART), *flags, check=False)
        assert refused.returncode != 0, "installed against an older CRD"
        assert f"CRD {name} has schema revision 1" in refused.stderr, refused.stderr
        assert f"needs {shipped_revision(name)}" in refused.stderr
        assert CRD_APPLY in refused.stderr and "--show-only templates/crds.yaml" in refused.stderr
    finally:
        fresh.kubectl(
            "annotate", "crd", name, f"{REVISION}={shipped_revision(name)}", "--overwrite"
        )
    # Rendered without the CRDs, every current one installed: accepted.
    khelm(fresh, "install", release, str(CHART), *flags)
    manifest = khelm(fresh, "get", "manifest", release, "-n", release_ns).stdout
    assert "kind: CustomResourceDefinition" not in manifest
    khelm(fresh, "uninstall", release, "-n", release_ns)


def crd_exists(cluster: LocalCluster, name: str) -> bool:
    got = cluster.kubectl("get", "crd", name, "-o", "name", check=False)
    return got.returncode == 0


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
    # The CRDs are kept from the releases of the tests above: a new release takes them over.
    khelm(
        fresh, "install", release, str(CHART), "-n", release_ns, "--take-ownership",
        *release_values(release_ns),
    )  # fmt: skip
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
    # Kept on purpose: the CRDs (crds.keep), so a re-install finds the objects.
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
