"""The chart's RBAC proven sufficient and minimal by running the operator under it.

The chart is rendered with helm; only its RBAC objects (ServiceAccounts, ClusterRoles,
bindings) are applied for real. Then, like the chart's two Deployments, a controller process
and a webhook process run locally, each with its own ServiceAccount's identity and the env of
its rendered Deployment, through the lease and artifact scenarios:

- two Ready Pods: one holds, with its token in its annotations and in the lease status;
- the holder goes NotReady: handover with a greater token;
- the holder publishes a FencedArtifact with its token (a Pod-bound token of the publisher
  ServiceAccount, bound with the chart's publisher ClusterRole): admitted, and the controller
  records ``status.acceptedFence`` (a status write that passes the webhook too);
- the old holder publishes with its old token: denied ``stale_fence``, and the webhook's
  Warning Event is posted under the webhook's RBAC;
- the controller's guard of the chart's webhook configuration (``FENCEDLEASE_WEBHOOK_GUARD``,
  not set by the chart yet) restores a loosened ``failurePolicy`` through its
  resourceNames-limited rule.

Neither process logs a refusal, and forbidden verbs fail (RBAC's "is forbidden: User ...")
through the same credentials, including the operator's own Python clients. The chart's default
(all namespaces: ClusterRoles) passes; its ``watchNamespace`` option (Roles) is an expected
failure, see ``WATCH_NAMESPACE_BUG``.

Identity: a kubeconfig with ``users[].user.as`` (impersonation) is honoured by kubectl but
ignored by kubernetes_asyncio's ``load_kube_config`` (it talks as the admin client
certificate; ``test_impersonating_kubeconfig_...`` shows it).
So the processes get what a Pod gets: a real ServiceAccount token (``kubectl create token``)
in their kubeconfig.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, free_port
from fencedlease.registration.selfregistration import ensure_local_certificates
from fencedlease.settings import Settings

from .chart import one, render
from .fence_harness import artifact as fenced_artifact
from .k8s import apply, lease, lease_status, pod_lease_annotations, running_operator, set_ready
from .k8s import wait_for as _wait_for

pytestmark = pytest.mark.timeout(180)

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
LEASE = "report"
ARTIFACT = "report-latest"
WORKER_SA = "worker"  # the application's ServiceAccount, bound to the publisher ClusterRole


def wait_for(probe: Any, what: str, timeout: float = 30.0) -> Any:
    return _wait_for(probe, timeout=timeout, what=what)


# ------------------------------------------------------------------------------ install


@dataclass
class Install:
    release: str
    release_ns: str  # where the chart's ServiceAccounts live
    app_ns: str  # where the application's leases, Pods and artifacts live
    fullname: str
    docs: list[dict[str, Any]]

    def sa(self, component: str) -> str:
        return f"{self.fullname}-{component}"

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{self.release_ns}:{self.sa(component)}"

    @property
    def webhook_configuration(self) -> dict[str, Any]:
        return one(self.docs, "MutatingWebhookConfiguration")

    def deployment_env(self, component: str) -> dict[str, str]:
        """The literal env of the chart's Deployment (no valueFrom, no in-cluster etcd TLS)."""
        dep = one(self.docs, "Deployment", f"-{component}")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        for local in ("ETCD_ENDPOINTS", "ETCD_CA_FILE", "ETCD_CERT_FILE", "ETCD_KEY_FILE"):
            env.pop(f"FENCEDLEASE_{local}", None)
        for flag in ("METRICS_PORT", "HEALTH_PORT", "WEBHOOK_PORT", "WEBHOOK_CERT_DIR"):
            env.pop(f"FENCEDLEASE_{flag}", None)  # set by flags here
        return env

    def deployment_args(self, component: str) -> list[str]:
        dep = one(self.docs, "Deployment", f"-{component}")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        args: list[str] = container["args"]
        assert args[0] == "run"
        return args[1:]


@contextmanager
def chart_rbac(cluster: LocalCluster, *, watch_namespace: bool = False) -> Iterator[Install]:
    """The chart's RBAC applied for real (unique release), plus a publisher app identity.

    ``watch_namespace``: the chart's ``watchNamespace`` option (Roles in the app namespace).
    """
    suffix = uuid.uuid4().hex[:6]
    release, release_ns, app_ns = f"rbo{suffix}", f"rbo-rel-{suffix}", f"rbo-app-{suffix}"
    for ns in (release_ns, app_ns):
        cluster.kubectl("create", "namespace", ns)
    flags = ["--set", f"watchNamespace={app_ns}"] if watch_namespace else []
    docs = render(release, release_ns, *flags)
    fullname = one(docs, "Deployment", "-controller")["metadata"]["name"].removesuffix(
        "-controller"
    )
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    # Role/RoleBinding: the controller's election Lease (release namespace), and with
    # watchNamespace the namespaced rules.
    expected = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert {d["kind"] for d in rbac} == expected
    cluster_scoped = [d for d in rbac if d["kind"] in CLUSTER_SCOPED]
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
        # The application side: its ServiceAccount may publish through the chart's role.
        cluster.kubectl("create", "serviceaccount", WORKER_SA, "-n", app_ns)
        cluster.kubectl(
            "create",
            "rolebinding",
            "publish",
            f"--clusterrole={fullname}-publisher",
            f"--serviceaccount={app_ns}:{WORKER_SA}",
            "-n",
            app_ns,
        )
        yield Install(release, release_ns, app_ns, fullname, docs)
    finally:
        names = [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in cluster_scoped]
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *names, check=False)


@pytest.fixture(scope="module")
def install(cluster: LocalCluster) -> Iterator[Install]:
    with chart_rbac(cluster) as installed:
        yield installed


# ------------------------------------------------------------------------- identities


def kubeconfig_for(cluster: LocalCluster, path: Path, user: dict[str, Any]) -> Path:
    """The cluster's kubeconfig with its user replaced by ``user``."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    (entry,) = config["users"]
    entry["user"] = user
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def admin_user(cluster: LocalCluster) -> dict[str, Any]:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    user: dict[str, Any] = config["users"][0]["user"]
    return dict(user)


def token_kubeconfig(
    cluster: LocalCluster, path: Path, namespace: str, sa: str, bound_pod: str | None = None
) -> Path:
    """A kubeconfig with a real ServiceAccount token (what a Pod of that account gets)."""
    args = ["create", "token", sa, "-n", namespace, "--duration=1h"]
    if bound_pod:
        args += ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod}"]
    token = cluster.kubectl(*args).stdout.strip()
    assert token.count(".") == 2, "not a JWT"
    return kubeconfig_for(cluster, path, {"token": token})


def kubectl_as(kubeconfig: Path, *args: str, input: str | None = None) -> Any:
    return subprocess.run(
        [str(binary_path("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def whoami_kubectl(kubeconfig: Path) -> str:
    result = kubectl_as(kubeconfig, "auth", "whoami", "-o", "json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["status"]["userInfo"]["username"])


def assert_forbidden(kubeconfig: Path, *args: str, input: str | None = None) -> None:
    """kubectl with ``kubeconfig`` is refused by RBAC (not by admission, not a usage error)."""
    result = kubectl_as(kubeconfig, *args, input=input)
    assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
    assert "is forbidden: User " in result.stderr, result.stderr


# What the operator's own client sees with a kubeconfig (run in a child process: the library
# keeps process-global configuration): the operator's KubeApi (kubernetes_asyncio), which its
# watches and writes all use.
PROBE = r"""
import asyncio, json, sys
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from fencedlease.kube import KubeApi

REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}

async def status_of(call):
    try:
        await call
    except ApiException as exc:
        return exc.status
    return 200

async def main(namespace, pod, watched=""):
    kube = await KubeApi.create()
    try:
        review = await client.AuthenticationV1Api(kube.api).create_self_subject_review(REVIEW)
        out = {
            "kubernetes_asyncio": review.status.user_info.username,
            "list_secrets": await status_of(kube.core.list_namespaced_secret(namespace)),
            "delete_pod": await status_of(
                kube.core.delete_namespaced_pod(pod, namespace, dry_run="All")
            ),
            "readiness_probe": await status_of(kube.list_leases_probe(watched or None)),
        }
    finally:
        await kube.close()
    print(json.dumps(out))

asyncio.run(main(*sys.argv[1:]))
"""


def probe_clients(kubeconfig: Path, namespace: str, pod: str, watched: str = "") -> dict[str, Any]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, namespace, pod, watched],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_impersonating_kubeconfig_is_ignored_by_the_python_clients(
    cluster: LocalCluster, install: Install, tmp_path: Path
) -> None:
    """Why the operator runs with a ServiceAccount token here, not with ``as``."""
    pod = f"probe-{uuid.uuid4().hex[:6]}"
    create_worker_pod(cluster, pod, install.app_ns)
    controller = install.user("controller")
    as_kubeconfig = kubeconfig_for(
        cluster, tmp_path / "as.kubeconfig", {**admin_user(cluster), "as": controller}
    )
    # kubectl honours `as`: it is the controller, which may not read Secrets.
    assert whoami_kubectl(as_kubeconfig) == controller
    assert_forbidden(as_kubeconfig, "get", "secrets", "-n", install.release_ns)

    # kubernetes_asyncio ignores it: it is the admin client certificate.
    seen = probe_clients(as_kubeconfig, install.release_ns, pod)
    assert seen["kubernetes_asyncio"] == "admin", f"kubernetes_asyncio now honours `as`: {seen}"
    assert seen["list_secrets"] == 200

    # A real ServiceAccount token is honoured by both.
    token = token_kubeconfig(
        cluster, tmp_path / "token.kubeconfig", install.release_ns, install.sa("controller")
    )
    assert whoami_kubectl(token) == controller
    seen = probe_clients(token, install.release_ns, pod)
    assert seen["kubernetes_asyncio"] == controller, seen
    assert seen["list_secrets"] == 403 and seen["delete_pod"] == 403, seen


# ------------------------------------------------------------------------------ scenario


def create_worker_pod(cluster: LocalCluster, name: str, namespace: str) -> None:
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "worker"}},
            "spec": {
                "serviceAccountName": WORKER_SA,
                "containers": [{"name": "main", "image": "example.invalid/worker:1"}],
            },
        },
    )


def held(cluster: LocalCluster, ns: str, exclude: str | None = None) -> tuple[str, int] | None:
    """(holder, token) once status and the holder's annotations agree."""
    status = lease_status(cluster, LEASE, ns)
    holder, token = status.get("holder"), status.get("fencingToken")
    if status.get("phase") != "Held" or not holder or not token or holder == exclude:
        return None
    ann = pod_lease_annotations(cluster, holder, ns, LEASE)
    if ann.get("state") != "held" or ann.get("token") != str(token):
        return None
    return str(holder), int(token)


def artifact(ns: str, token: int, ref: str) -> dict[str, Any]:
    return fenced_artifact(ns, ARTIFACT, LEASE, token, ref, op=f"{ref}-{uuid.uuid4().hex[:6]}")


def publish(kubeconfig: Path, ns: str, token: int, ref: str) -> Any:
    return kubectl_as(kubeconfig, "apply", "-f", "-", input=json.dumps(artifact(ns, token, ref)))


def accepted_fence(cluster: LocalCluster, ns: str) -> int | None:
    result = cluster.kubectl("get", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns,
                             "-o", "json", check=False)  # fmt: skip
    if result.returncode != 0:
        return None
    value = (json.loads(result.stdout).get("status") or {}).get("acceptedFence")
    return int(value) if value is not None else None


def events(cluster: LocalCluster, ns: str, reason: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return [e for e in items if e.get("reason") == reason]


def chart_webhook_configuration(install: Install, port: int, cert_dir: Path) -> dict[str, Any]:
    """The chart's configuration, calling the local webhook by URL instead of the Service.

    Everything else is the chart's; a namespaceSelector keeps it to this test's namespace
    (failurePolicy Fail must not reach other tests' artifacts in the shared control plane).
    """
    certs = ensure_local_certificates(
        Settings(webhook_cert_dir=cert_dir, webhook_url_host="127.0.0.1")
    )
    config: dict[str, Any] = copy.deepcopy(install.webhook_configuration)
    for hook in config["webhooks"]:  # one entry per review kind, each on its own path
        service = hook["clientConfig"]["service"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{service['path']}",
            "caBundle": base64.b64encode(certs.ca.cert_pem()).decode(),
        }
        selector = {"kubernetes.io/metadata.name": install.app_ns}
        hook["namespaceSelector"] = {"matchLabels": selector}
    return config


REFUSED = re.compile(r"forbidden|status[=:]\s*403|\(403\)", re.IGNORECASE)


def forbidden_lines(log: Path) -> list[str]:
    """The watch loops (``403: ... is forbidden``), kubernetes_asyncio ((403) Reason:
    Forbidden)."""
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        # The guard's expected refusal to re-create a deleted configuration is not a gap.
        if REFUSED.search(line) and "may not restore it" not in line
    ]


@pytest.mark.parametrize(
    "watch_namespace",
    [
        pytest.param(False, id="all-namespaces"),
        pytest.param(True, id="watchNamespace"),
    ],
)
def test_operator_runs_under_the_chart_rbac(
    cluster: LocalCluster, tmp_path: Path, watch_namespace: bool
) -> None:
    with chart_rbac(cluster, watch_namespace=watch_namespace) as install:
        run_under_chart_rbac(cluster, install, tmp_path, watch_namespace)


def run_under_chart_rbac(
    cluster: LocalCluster, install: Install, tmp_path: Path, watch_namespace: bool
) -> None:
    ns = install.app_ns
    kubeconfigs = {
        component: token_kubeconfig(
            cluster, tmp_path / f"{component}.kubeconfig", install.release_ns, install.sa(component)
        )
        for component in ("controller", "webhook")
    }
    for component, kubeconfig in kubeconfigs.items():
        assert whoami_kubectl(kubeconfig) == install.user(component)
    # The controller's readiness probe (one list of FencedLeases, in the watched namespace when
    # there is one) must be allowed, or the process never becomes ready.
    probe = probe_clients(kubeconfigs["controller"], ns, "none", ns if watch_namespace else "")
    assert probe["readiness_probe"] == 200, f"the controller's readiness probe is refused: {probe}"

    prefix = f"/fencedlease-rbac-{uuid.uuid4().hex[:6]}"  # this test's own lease store
    port, cert_dir = free_port(), tmp_path / "webhook-tls"
    config = chart_webhook_configuration(install, port, cert_dir)
    config_name = config["metadata"]["name"]
    # The chart's env (it turns on the guard of the chart's webhook configuration, the
    # controller's only use of its cluster-scoped mutatingwebhookconfigurations rule).
    key_file = tmp_path / "token-key"  # the chart mounts its <release>-authority Secret
    key_file.write_text(uuid.uuid4().hex)
    controller_env = {
        **install.deployment_env("controller"),
        "FENCEDLEASE_ETCD_PREFIX": prefix,
        "FENCEDLEASE_WEBHOOK_GUARD": "true",
        "FENCEDLEASE_TOKEN_KEY_FILE": str(key_file),
    }
    webhook_env = {**install.deployment_env("webhook"), "FENCEDLEASE_ETCD_PREFIX": prefix}
    if watch_namespace:
        assert controller_env["FENCEDLEASE_NAMESPACE"] == ns
    assert controller_env["FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME"] == config_name
    assert webhook_env["FENCEDLEASE_WEBHOOK_REGISTRATION"] == "none"
    logs = tmp_path / "logs"
    try:
        with running_operator(
            cluster,
            logs,
            *install.deployment_args("webhook"),
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            str(cert_dir),
            name="webhook",
            env=webhook_env,
            kubeconfig=kubeconfigs["webhook"],
        ):
            # The chart creates its configuration; here it calls the local webhook by URL.
            cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
            with running_operator(
                cluster,
                logs,
                *install.deployment_args("controller"),
                # With watchNamespace the chart's env says so; the all-namespaces install is
                # run on this namespace only (the control plane is shared with other tests).
                *([] if watch_namespace else ["--namespace", ns]),
                name="controller",
                env=controller_env,
                kubeconfig=kubeconfigs["controller"],
            ):
                run_scenario(cluster, install, tmp_path)
                check_guard_restores(
                    cluster,
                    config_name,
                    logs / "controller.log",
                    ns,  # the controller watches only ns in both variants (flag or chart env)
                )
    finally:
        cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", config_name, "--ignore-not-found",
            check=False,
        )  # fmt: skip
    for name in ("controller", "webhook"):
        log = logs / f"{name}.log"
        assert log.read_text().strip(), f"{name} logged nothing"
        assert not forbidden_lines(log), f"{name} was refused:\n" + "\n".join(forbidden_lines(log))
        assert "could not post Event" not in log.read_text(), log.read_text()


def run_scenario(cluster: LocalCluster, install: Install, tmp_path: Path) -> None:
    ns = install.app_ns
    for pod in ("w-a", "w-b"):
        create_worker_pod(cluster, pod, ns)
        set_ready(cluster, pod, ns, True)
    apply(cluster, lease(LEASE, ns, duration=3))

    holder1, t1 = wait_for(lambda: held(cluster, ns), "a first holder")
    as_holder1 = token_kubeconfig(
        cluster, tmp_path / "holder1.kubeconfig", ns, WORKER_SA, bound_pod=holder1
    )
    assert whoami_kubectl(as_holder1) == f"system:serviceaccount:{ns}:{WORKER_SA}"
    result = publish(as_holder1, ns, t1, f"reports/{holder1}-{t1}")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: accepted_fence(cluster, ns) == t1, f"acceptedFence {t1}")
    wait_for(lambda: events(cluster, ns, "FenceAccepted"), "the controller's FenceAccepted Event")

    set_ready(cluster, holder1, ns, False)
    holder2, t2 = wait_for(lambda: held(cluster, ns, exclude=holder1), "a handover")
    assert t2 > t1
    as_holder2 = token_kubeconfig(
        cluster, tmp_path / "holder2.kubeconfig", ns, WORKER_SA, bound_pod=holder2
    )
    result = publish(as_holder2, ns, t2, f"reports/{holder2}-{t2}")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: accepted_fence(cluster, ns) == t2, f"acceptedFence {t2}")

    stale = publish(as_holder1, ns, t1, f"reports/{holder1}-{t1}-late")
    assert stale.returncode != 0 and "stale_fence" in stale.stderr, stale.stderr
    assert accepted_fence(cluster, ns) == t2
    # Only the webhook process posts denial Events: it may, under the webhook's RBAC.
    wait_for(lambda: events(cluster, ns, "FenceStaleFence"), "the webhook's FenceStaleFence Event")

    check_forbidden_verbs(cluster, install, tmp_path, as_holder2, holder2)

    # Deleting the artifact: the controller, under the chart's RBAC, removes the
    # high-water-mark finalizer once the mark covers t2 (a refused patch would leave it stuck).
    cluster.kubectl("delete", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns, "--wait=false")
    wait_for(
        lambda: (
            cluster.kubectl(
                "get", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns, check=False
            ).returncode
            != 0
        ),
        "the artifact deleted (finalizer removed by the controller)",
    )
    again = publish(as_holder1, ns, t1, f"reports/{holder1}-{t1}-recreated")
    assert again.returncode != 0 and "stale_fence" in again.stderr, again.stderr


def check_guard_restores(cluster: LocalCluster, name: str, log: Path, event_namespace: str) -> None:
    """The controller guards the chart's configuration with its resourceNames-limited rule."""
    assert "guarding webhook configuration" in log.read_text()
    loosen = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    cluster.kubectl(
        "patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(loosen)
    )

    def policy() -> str:
        out = cluster.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout
        return str(json.loads(out)["webhooks"][0]["failurePolicy"])

    wait_for(lambda: policy() == "Fail", "the guard to restore failurePolicy Fail")
    # Its Warning Event about the cluster-scoped configuration goes to the operator's namespace
    # (the watched one; with neither a watched namespace nor POD_NAMESPACE it is "default").
    wait_for(
        lambda: [
            e
            for e in events(cluster, event_namespace, "WebhookConfigurationRestored")
            if e["involvedObject"]["name"] == name
        ],
        "the guard's WebhookConfigurationRestored Event",
    )
    # Deleted: the chart grants no `create` on webhook configurations (it cannot be limited to
    # one name), so the guard cannot recreate it and says so instead.
    cluster.kubectl("delete", "mutatingwebhookconfiguration", name)
    wait_for(
        lambda: [
            e
            for e in events(cluster, event_namespace, "WebhookConfigurationUnguarded")
            if e["involvedObject"]["name"] == name and "helm upgrade" in e["message"]
        ],
        "the guard's WebhookConfigurationUnguarded Event",
    )


def check_forbidden_verbs(
    cluster: LocalCluster, install: Install, tmp_path: Path, as_holder: Path, holder: str
) -> None:
    """Through the very credentials the processes use (and the holder's), not ``can-i``."""
    ns = install.app_ns
    controller = tmp_path / "controller.kubeconfig"
    webhook = tmp_path / "webhook.kubeconfig"

    # The operator's own client (kubernetes_asyncio KubeApi) with the controller's token:
    # the controller's identity, refused Secrets and Pod deletion.
    seen = probe_clients(controller, ns, holder)
    assert seen["kubernetes_asyncio"] == install.user("controller")
    assert seen["list_secrets"] == 403 and seen["delete_pod"] == 403, seen

    assert_forbidden(controller, "get", "secrets", "-n", install.release_ns)
    assert_forbidden(controller, "delete", "pod", holder, "-n", ns, "--dry-run=server")
    # (It may create and delete FencedLeases: the leases of items claimed from code.)
    assert_forbidden(controller, "delete", "fencedclaims.fencedlease.io", "any", "-n", ns)
    # The controller may patch artifacts (their finalizer), but a spec write is fenced like
    # anyone's: it is not a holder Pod and not an allowed writer.
    spec_write = kubectl_as(
        controller, "patch", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns,
        "--type=merge", "-p", '{"spec":{"fencingToken":1}}',
    )  # fmt: skip
    assert spec_write.returncode != 0 and "denied the request" in spec_write.stderr, (
        spec_write.stderr
    )
    other = "someone-else.example.com"
    assert_forbidden(
        controller, "patch", "mutatingwebhookconfiguration", other,
        "--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}',
    )  # fmt: skip
    own = install.webhook_configuration["metadata"]["name"]
    assert_forbidden(controller, "delete", "mutatingwebhookconfiguration", own, "--dry-run=server")

    assert_forbidden(webhook, "get", "pods", "-n", ns)
    assert_forbidden(
        webhook, "patch", "fencedleases.fencedlease.io", LEASE, "-n", ns,
        "--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}',
    )  # fmt: skip
    assert_forbidden(webhook, "get", "secrets", "-n", install.release_ns)

    # The publisher role: no status (the operator records acceptedFence), no delete.
    assert_forbidden(
        as_holder, "patch", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns,
        "--subresource=status", "--type=merge", "-p", '{"status":{"acceptedFence":999}}',
    )  # fmt: skip
    assert_forbidden(as_holder, "delete", "fencedartifacts.fencedlease.io", ARTIFACT, "-n", ns)
    assert_forbidden(
        as_holder, "patch", "fencedleases.fencedlease.io", LEASE, "-n", ns,
        "--subresource=status", "--type=merge", "-p", '{"status":{"holder":"me"}}',
    )  # fmt: skip
    assert_forbidden(as_holder, "get", "secrets", "-n", ns)
