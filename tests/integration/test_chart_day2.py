"""The chart's day-2 options against the real helm (and, for the certificates, the real
kube-apiserver through ``lookup``): a controller that survives drains, a webhook reachable on a
configurable port or the node's network, egress policies, the etcd backup CronJob and webhook
certificates that renew before they expire (docs/install.md, docs/operations.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex
import time
import uuid
from typing import Any

import pytest
import yaml
from cryptography import x509

from fencedlease.cli import build_parser

from .chart import CHART, helm, kinds, one, render

pytestmark = pytest.mark.timeout(300)

NS = "fl-system"


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def _component(doc: dict[str, Any]) -> str:
    labels: dict[str, str] = doc["spec"]["selector"]["matchLabels"]
    return labels["app.kubernetes.io/component"]


# --------------------------------------------------------------- drains and spreading


def test_a_drain_never_evicts_every_controller_or_webhook() -> None:
    docs = render("fencedlease", NS)
    budgets = {_component(p): p for p in kinds(docs, "PodDisruptionBudget")}
    assert set(budgets) == {"controller", "webhook", "etcd"}
    for role in ("controller", "webhook"):
        deployment = one(docs, "Deployment", f"-{role}")
        assert budgets[role]["spec"]["minAvailable"] == 1
        assert deployment["spec"]["replicas"] == 2
        # The budget selects exactly the Deployment's Pods.
        assert budgets[role]["spec"]["selector"] == deployment["spec"]["selector"]
        pod = _pod(deployment)
        term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )
        # Over zones, then nodes (controller/webhook.topologySpreadConstraints), each with the
        # Deployment's own Pods as the selector.
        spreads = pod["topologySpreadConstraints"]
        assert [s["topologyKey"] for s in spreads] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        for spread in spreads:
            assert spread["labelSelector"] == deployment["spec"]["selector"]

    hard = _pod(
        one(
            render("fencedlease", NS, "--set", "controller.podAntiAffinity=hard"),
            "Deployment",
            "-controller",
        )
    )
    assert hard["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    none = _pod(
        one(
            render("fencedlease", NS, "--set", "controller.podAntiAffinity=none"),
            "Deployment",
            "-controller",
        )
    )
    assert "affinity" not in none
    # One replica: a budget that keeps it would block every node drain, so there is none.
    single = render(
        "fencedlease", NS, "--set", "controller.replicas=1", "--set", "webhook.replicas=1"
    )
    assert {_component(p) for p in kinds(single, "PodDisruptionBudget")} == {"etcd"}


# ------------------------------------------------------------------- the webhook's port


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize("host_network", [False, True])
def test_every_part_follows_the_webhook_port(host_network: bool) -> None:
    flags = ["--set", "webhook.securePort=10260", "--set", "webhook.healthPort=10262"]
    flags += ["--set", "webhook.metricsPort=10261", "--set", f"webhook.hostNetwork={host_network}"]
    docs = render("fencedlease", NS, *flags)
    pod = _pod(one(docs, "Deployment", "-webhook"))
    (container,) = pod["containers"]
    ports, env = _ports(container), _env(container)
    assert ports == {"webhook": 10260, "metrics": 10261, "health": 10262}
    # The server listens where the container port says, and so do the probes.
    assert env["FENCEDLEASE_WEBHOOK_PORT"] == "10260"
    assert env["FENCEDLEASE_METRICS_PORT"] == "10261"
    assert env["FENCEDLEASE_HEALTH_PORT"] == "10262"
    assert sum(e["name"] == "FENCEDLEASE_HEALTH_PORT" for e in container["env"]) == 1
    for probe in ("livenessProbe", "readinessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == 10262
    # The Service keeps 443 for the API server and targets the container's port.
    service = one(docs, "Service", "-webhook")
    (sport,) = service["spec"]["ports"]
    assert sport["port"] == 443 and ports[sport["targetPort"]] == 10260
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["webhooks"][0]["clientConfig"]["service"]["port"] == 443
    policy = one(docs, "NetworkPolicy", "-webhook")
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert allowed == {10260, 10261, 10262}
    assert pod.get("hostNetwork", False) is host_network
    if host_network:
        # The etcd Service names still resolve through the cluster DNS.
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    # The controller keeps its own ports.
    controller = _pod(one(docs, "Deployment", "-controller"))["containers"][0]
    assert _ports(controller) == {"metrics": 8080, "health": 8081}
    assert _env(controller)["FENCEDLEASE_HEALTH_PORT"] == "8081"


# ------------------------------------------------------------------------------ egress


def test_egress_policies_are_an_option_that_leaves_what_each_pod_needs() -> None:
    default = render("fencedlease", NS)
    for policy in kinds(default, "NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    extra = [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 443}]}]
    api = [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    docs = render(
        "fencedlease",
        NS,
        "--set",
        "networkPolicy.egress.enabled=true",
        "--set-json",
        f"networkPolicy.egress.extraRules={json.dumps(extra)}",
        "--set-json",
        f"networkPolicy.egress.apiServer={json.dumps(api)}",
    )
    policies = {
        p["metadata"]["name"].removeprefix("fencedlease-"): p for p in kinds(docs, "NetworkPolicy")
    }
    assert set(policies) == {"webhook", "controller", "etcd", "etcd-backup"}

    def ports(rule: dict[str, Any]) -> set[int]:
        return {p["port"] for p in rule["ports"]}

    for name, policy in policies.items():
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], name
        rules = policy["spec"]["egress"]
        assert any(ports(r) == {53} for r in rules), f"{name}: no DNS"
        assert extra[0] in rules, f"{name}: extraRules missing"
        etcd_rules = [r for r in rules if 2379 in ports(r)]
        assert etcd_rules, f"{name}: cannot reach etcd"
        for rule in etcd_rules:
            (peer,) = rule["to"]
            assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"
        reaches_api = any(r.get("to") == api and ports(r) == {443, 6443} for r in rules)
        assert reaches_api is (name in ("webhook", "controller")), name

    external = render(
        "fencedlease",
        NS,
        "--set",
        "networkPolicy.egress.enabled=true",
        "--set",
        "etcd.bundled.enabled=false",
        "--set",
        "etcd.endpoints={https://etcd.example:2379}",
        "--set-json",
        'networkPolicy.egress.externalEtcd=[{"ipBlock": {"cidr": "192.0.2.10/32"}}]',
    )
    controller = one(external, "NetworkPolicy", "-controller")["spec"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
        "ports": [{"port": 2379, "protocol": "TCP"}],
    } in controller


# ------------------------------------------------------------------------------ backup


def test_the_backup_cronjob_snapshots_the_bundled_etcd_and_keeps_the_newest() -> None:
    docs = render("fencedlease", NS)
    cron = one(docs, "CronJob", "-etcd-backup")
    assert "backup" in cron["metadata"]["name"]
    spec = cron["spec"]
    assert spec["schedule"] == "7 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"  # never two snapshots writing one target
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    (snapshot,) = pod["initContainers"]
    (retain,) = pod["containers"]
    # etcdctl from the etcd image, over TLS with the operator's client certificate, to the
    # client Service (a name in the etcd server certificate).
    etcd = one(docs, "StatefulSet", "-etcd")
    assert snapshot["image"] == etcd["spec"]["template"]["spec"]["containers"][0]["image"]
    assert snapshot["command"] == ["/usr/local/bin/etcdctl"]
    args = snapshot["args"]
    assert args[-3:] == ["snapshot", "save", "/backup/.incoming.db"]
    assert f"--endpoints=https://fencedlease-etcd.{NS}.svc:2379" in args
    mounts = {m["name"]: m["mountPath"] for m in snapshot["volumeMounts"]}
    for flag, file in (("--cacert", "ca.crt"), ("--cert", "tls.crt"), ("--key", "tls.key")):
        assert f"{flag}={mounts['etcd-client-tls']}/{file}" in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["etcd-client-tls"]["secret"]["secretName"] == "fencedlease-etcd-client-tls"
    # The retention step is a command of this package, with these very arguments.
    parsed = build_parser().parse_args(retain["args"])
    assert (parsed.command, parsed.etcd_command, parsed.backups_command) == (
        "etcd",
        "backups",
        "rotate",
    )
    assert str(parsed.dir) == mounts["backup"] and parsed.incoming == ".incoming.db"
    assert parsed.keep == 48 and parsed.prefix == "fencedlease-etcd"
    # The target: the chart's PVC, kept on uninstall; only the backup Pods reach etcd besides
    # the operator (etcd's NetworkPolicy lets its label in).
    claim = one(docs, "PersistentVolumeClaim", "-etcd-backup")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert volumes["backup"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    labels = spec["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "etcd-backup"
    for c in (snapshot, retain):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True

    nfs = {"nfs": {"server": "nfs.example", "path": "/fencedlease"}}
    elsewhere = render(
        "fencedlease",
        NS,
        "--set-json",
        f"etcd.backup.volume={json.dumps(nfs)}",
        "--set",
        "etcd.backup.keep=5",
    )
    assert not kinds(elsewhere, "PersistentVolumeClaim")
    pod = one(elsewhere, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["backup"] == {"name": "backup", **nfs}
    assert "--keep=5" in pod["containers"][0]["args"]
    for off in (
        ["--set", "etcd.backup.enabled=false"],
        ["--set", "etcd.bundled.enabled=false", "--set", "etcd.endpoints={https://e:2379}"],
    ):
        assert not kinds(render("fencedlease", NS, *off), "CronJob"), off


# --------------------------------------------------------------- webhook certificates


def _dry_run(cluster: Any, ns: str, *flags: str, check: bool = True) -> Any:
    """``helm template --dry-run=server`` of the chart into ``ns`` (as ``helm upgrade`` would
    render it: ``lookup`` reads the live cluster)."""
    return helm(
        "template",
        "fencedlease",
        str(CHART),
        "--namespace",
        ns,
        "--dry-run=server",
        f"--kubeconfig={cluster.kubeconfig}",
        *flags,
        check=check,
    )


def _server_render(cluster: Any, ns: str, *flags: str) -> dict[str, dict[str, Any]]:
    """``helm template --dry-run=server``: the chart's ``lookup`` reads the live cluster,
    as on ``helm upgrade``."""
    out = _dry_run(cluster, ns, *flags).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {
        "tls": one(docs, "Secret", "-webhook-tls"),
        "ca": one(docs, "Secret", "-webhook-tls-ca"),
        "mwc": one(docs, "MutatingWebhookConfiguration"),
    }


def _apply(cluster: Any, *secrets: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets))


def _certs(pem_b64: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(pem_b64))


def _bundle(r: dict[str, dict[str, Any]]) -> str:
    value: str = r["mwc"]["webhooks"][0]["clientConfig"]["caBundle"]
    return value


def _annotate(cluster: Any, ns: str, name: str, not_after: float) -> None:
    cluster.kubectl(
        "annotate",
        "secret",
        name,
        "-n",
        ns,
        "--overwrite",
        f"fencedlease.io/not-after={int(not_after)}",
    )


def test_generated_webhook_certificates_are_kept_then_renewed_before_expiry(cluster: Any) -> None:
    ns = f"certs-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    day = 86400
    first = _server_render(cluster, ns)
    leaf = x509.load_pem_x509_certificate(base64.b64decode(first["tls"]["data"]["tls.crt"]))
    (ca,) = _certs(first["ca"]["data"]["tls.crt"])
    assert _bundle(first) == first["ca"]["data"]["tls.crt"] == first["tls"]["data"]["ca.crt"]
    leaf.verify_directly_issued_by(ca)
    # The recorded expiry is the certificate's own, to the minute.
    recorded = int(first["tls"]["metadata"]["annotations"]["fencedlease.io/not-after"])
    assert abs(recorded - leaf.not_valid_after_utc.timestamp()) < 120
    assert 364 * day < recorded - time.time() < 366 * day
    _apply(cluster, first["tls"], first["ca"])

    # An upgrade well before expiry keeps everything (no new pair per render).
    again = _server_render(cluster, ns)
    assert again["tls"]["data"] == first["tls"]["data"] and _bundle(again) == _bundle(first)

    # Within renewBeforeDays (60) of expiry: a new certificate from the same CA, so the
    # caBundle does not change while the kubelet refreshes the mounted Secret.
    _annotate(cluster, ns, first["tls"]["metadata"]["name"], time.time() + 59 * day)
    renewed = _server_render(cluster, ns)
    assert renewed["tls"]["data"]["tls.crt"] != first["tls"]["data"]["tls.crt"]
    assert renewed["tls"]["data"]["tls.key"] != first["tls"]["data"]["tls.key"]
    assert _bundle(renewed) == _bundle(first) and renewed["ca"]["data"] == first["ca"]["data"]
    new_leaf = x509.load_pem_x509_certificate(base64.b64decode(renewed["tls"]["data"]["tls.crt"]))
    new_leaf.verify_directly_issued_by(ca)
    assert new_leaf.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=364)
    _apply(cluster, renewed["tls"])

    # A CA that would expire before a new certificate is replaced; both CAs are trusted
    # through the change (the Pods still serve a certificate of the old one for a while).
    _annotate(cluster, ns, first["ca"]["metadata"]["name"], time.time() + 300 * day)
    rotated = _server_render(cluster, ns)
    (new_ca,) = _certs(rotated["ca"]["data"]["tls.crt"])
    assert new_ca != ca
    assert _certs(_bundle(rotated)) == [new_ca, ca]
    x509.load_pem_x509_certificate(
        base64.b64decode(rotated["tls"]["data"]["tls.crt"])
    ).verify_directly_issued_by(new_ca)
    _apply(cluster, rotated["tls"], rotated["ca"])
    settled = _server_render(cluster, ns)
    assert _certs(_bundle(settled)) == [new_ca]  # the next upgrade drops the old CA

    # A release of an older chart (a Secret without expiry, no CA key): a new CA and
    # certificate, the old CA trusted through the change.
    old_ca = settled["tls"]["data"]["ca.crt"]
    cluster.kubectl("delete", "secret", "-n", ns, settled["ca"]["metadata"]["name"])
    cluster.kubectl(
        "annotate",
        "secret",
        "-n",
        ns,
        settled["tls"]["metadata"]["name"],
        "fencedlease.io/not-after-",
    )
    migrated = _server_render(cluster, ns)
    assert _certs(_bundle(migrated))[1:] == _certs(old_ca)


def test_the_kubelet_port_is_refused_on_the_host_network() -> None:
    result = helm(
        "template",
        "x",
        str(CHART),
        "--set",
        "webhook.hostNetwork=true",
        "--set",
        "webhook.healthPort=10250",
        check=False,
    )
    assert (
        result.returncode != 0 and "webhook.healthPort=10250 is the kubelet's port" in result.stderr
    ), shlex.join(["stderr:", result.stderr])


# ----------------------------------------------------------- restore and resize in the cluster


def _apply_release(cluster: Any, ns: str) -> list[dict[str, Any]]:
    """The chart's etcd StatefulSet and controller Deployment as objects of the API server (no
    node runs them: the restore command reads them)."""
    docs = render("fencedlease", ns)
    objs = [one(docs, "StatefulSet", "-etcd"), one(docs, "Deployment", "-controller")]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))
    return docs


def _restore_pods(cluster: Any, ns: str, *flags: str) -> list[dict[str, Any]]:
    import contextlib
    import io

    from fencedlease.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "etcd",
                "restore-pods",
                f"--namespace={ns}",
                "--statefulset=fencedlease-etcd",
                "--snapshot=fencedlease-etcd-20261206T030700Z.db",
                f"--kubeconfig={cluster.kubeconfig}",
                *flags,
            ]
        )
    assert code == 0
    listed = json.loads(out.getvalue())
    assert listed["kind"] == "List"
    items: list[dict[str, Any]] = listed["items"]
    return items


def _arg(args: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    return value


def test_restore_pods_restore_every_member_of_the_charts_etcd(cluster: Any) -> None:
    ns = f"restore-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    docs = _apply_release(cluster, ns)
    sts = one(docs, "StatefulSet", "-etcd")
    etcd_args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    controller = one(docs, "Deployment", "-controller")
    items = _restore_pods(cluster, ns, "--min-token=5000000000")
    assert [i["kind"] for i in items] == ["Pod"] * 3
    for i, pod in enumerate(items):
        member = f"fencedlease-etcd-{i}"
        spec = pod["spec"]
        (restore,) = spec["containers"]
        (aside,) = spec["initContainers"]
        args = restore["args"]
        # The chart's etcd image runs etcdutl; the member, its peers and the cluster token are
        # the StatefulSet's own, with $(POD_NAME) resolved.
        assert restore["image"] == sts["spec"]["template"]["spec"]["containers"][0]["image"]
        assert restore["command"] == ["/usr/local/bin/etcdutl"]
        assert args[:3] == ["snapshot", "restore", "/backup/fencedlease-etcd-20261206T030700Z.db"]
        assert _arg(args, "name") == member
        assert _arg(args, "initial-cluster") == _arg(etcd_args, "initial-cluster")
        assert _arg(args, "initial-cluster-token") == _arg(etcd_args, "initial-cluster-token")
        assert _arg(args, "initial-advertise-peer-urls") == _arg(
            etcd_args, "initial-advertise-peer-urls"
        ).replace("$(POD_NAME)", member)
        assert _arg(args, "data-dir") == _arg(etcd_args, "data-dir")
        # Every member the same bump, above the floor whatever the snapshot's revision.
        assert int(_arg(args, "bump-revision")) > 5_000_000_000 and "--mark-compacted" in args
        # The old data directory is moved aside (kept), by the operator's image.
        assert aside["image"] == controller["spec"]["template"]["spec"]["containers"][0]["image"]
        assert f"mv {_arg(etcd_args, 'data-dir')} " in aside["command"][-1]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == f"data-{member}"
        assert volumes["backup"]["persistentVolumeClaim"] == {
            "claimName": "fencedlease-etcd-backup",
            "readOnly": True,
        }
        assert spec["securityContext"] == sts["spec"]["template"]["spec"]["securityContext"]
    # The API server accepts them as they are.
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert result.returncode == 0, result.stderr

    # Resizing to 5: two new claims shaped like the StatefulSet's template, five members.
    resized = _restore_pods(cluster, ns, "--members=5")
    claims = [i for i in resized if i["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == [
        "data-fencedlease-etcd-3",
        "data-fencedlease-etcd-4",
    ]
    # (as the API server serves the template: with its defaults, e.g. volumeMode)
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"].items() <= claims[0]["spec"].items()
    restores = [i for i in resized if i["kind"] == "Pod"]
    assert len(restores) == 5
    assert (
        _arg(restores[0]["spec"]["containers"][0]["args"], "initial-cluster").count("https://") == 5
    )
    only = _restore_pods(cluster, ns, "--member=1")
    assert [i["metadata"]["name"].rsplit("-restore-", 1)[0] for i in only] == ["fencedlease-etcd-1"]


def test_the_bundled_etcd_cannot_be_resized_in_place(cluster: Any) -> None:
    ns = f"resize-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    _apply_release(cluster, ns)

    def upgrade(*flags: str) -> Any:
        return _dry_run(cluster, ns, *flags, check=False)

    refused = upgrade("--set", "etcd.bundled.replicas=5")
    assert refused.returncode != 0
    assert "cannot change from 3 to 5 on a running etcd" in refused.stderr, refused.stderr
    assert upgrade().returncode == 0
    # Scaled to 0 for the restore into 5 members: the upgrade to 5 goes through.
    cluster.kubectl("scale", "statefulset", "fencedlease-etcd", "-n", ns, "--replicas=0")
    assert upgrade("--set", "etcd.bundled.replicas=5").returncode == 0
