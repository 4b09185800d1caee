"""The Helm chart against the real helm (built from Go modules) and the real kube-apiserver.

- the chart's CRDs are the repository's ``crds/`` (``files/crds`` links to it; also inside
  ``helm package``), rendered by ``templates/crds.yaml``; their upgrade and the schema-revision
  check of ``crds.enabled=false`` are in ``test_upgrade.py``;
- ``helm lint --strict`` and ``helm template`` with default values and each option flipped;
- every rendered object passes ``kubectl apply --dry-run=server`` on the local control plane.
  The Prometheus Operator and cert-manager kinds get minimal stub CRDs (schema: preserve unknown
  fields) so the server checks their apiVersion/kind/metadata; their specs are checked here,
  client-side, against the fields the real operators require;
- ``values.schema.json`` rejects typos; the values table in docs/install.md is in sync;
- the alerts and the Grafana dashboard query only metric names the operator exposes;
- the rendered RBAC, applied for real, grants the operator's verbs and refuses others
  (``kubectl auth can-i --as system:serviceaccount:...``).

Regenerate the docs table with ``.venv/bin/python -m tests.integration.test_chart --write-docs``.
"""

from __future__ import annotations

import base64
import filecmp
import json
import re
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chart import CHART, ROOT, helm, kinds, one, render

CRDS = ROOT / "crds"
INSTALL_DOC = ROOT / "docs" / "install.md"
TABLE_BEGIN = "<!-- values-table:begin (generated from values.schema.json) -->"
TABLE_END = "<!-- values-table:end -->"

pytestmark = pytest.mark.timeout(300)

# Option sets rendered and applied: default values and each option flipped.
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "cert-manager": ["--set", "certManager.enabled=true"],
    "external-etcd": [
        "--set",
        "etcd.bundled.enabled=false",
        "--set",
        "etcd.endpoints={https://etcd-0.example:2379,https://etcd-1.example:2379}",
        "--set",
        "etcd.tls.secretName=etcd-client",
    ],
    "external-etcd-plaintext": [
        "--set",
        "etcd.bundled.enabled=false",
        "--set",
        "etcd.endpoints={http://etcd.example:2379}",
    ],
    "monitoring": [
        "--set",
        "monitoring.enabled=true",
        "--set",
        "monitoring.labels.release=prom",
        "--set",
        "monitoring.dashboard.enabled=true",
    ],
    "namespace-scoped": ["--set", "watchNamespace=WATCHNS"],
    "gitops-secret": [
        "--set",
        "webhook.tls.genSelfSigned=false",
        "--set",
        "webhook.tls.secretName=my-webhook-tls",
        "--set",
        "webhook.tls.caBundle=" + base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(),
    ],
    "everything": [
        "--set",
        "certManager.enabled=true",
        "--set",
        "monitoring.enabled=true",
        "--set",
        "monitoring.dashboard.enabled=true",
        "--set",
        "monitoring.dashboard.namespace=WATCHNS",
        "--set",
        "monitoring.dashboard.annotations.grafana_folder=fencedlease",
        "--set",
        "watchNamespace=WATCHNS",
        "--set",
        "rbac.publisher.aggregateToEdit=true",
        "--set",
        "webhook.podAntiAffinity=hard",
        "--set",
        "webhook.replicas=3",
    ],
    # The availability options (docs/install.md, "Reaching the webhook", "Network policies").
    "hardened": [
        "--set",
        "webhook.hostNetwork=true",
        "--set",
        "webhook.securePort=10260",
        "--set",
        "webhook.metricsPort=10261",
        "--set",
        "webhook.healthPort=10262",
        "--set",
        "networkPolicy.egress.enabled=true",
        "--set",
        "controller.podAntiAffinity=hard",
        "--set-json",
        'etcd.backup.volume={"nfs": {"server": "nfs.example", "path": "/fencedlease"}}',
    ],
    # test_chart_conventions.py: an umbrella's globals, scheduling, digests, extra arguments.
    "conventions": [
        "--set-json",
        'global={"imagePullSecrets": [{"name": "pull"}], "priorityClassName": "platform"}',
        "--set",
        "image.digest=sha256:" + "ab" * 32,
        "--set",
        "etcd.bundled.image.digest=sha256:" + "cd" * 32,
        "--set",
        "etcd.bundled.priorityClassName=etcd-critical",
        "--set-json",
        'etcd.bundled.tolerations=[{"key": "dedicated", "operator": "Exists"}]',
        "--set-json",
        'etcd.bundled.affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution"'
        ': [{"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "In",'
        ' "values": ["etcd"]}]}}]}}',
        "--set",
        "etcd.bundled.extraArgs={--snapshot-count=50000}",
        "--set",
        "controller.extraArgs={--verbose}",
        "--set",
        "serviceAccount.name=platform-fl",
        "--set",
        "crds.keep=false",
    ],
}

# Minimal stand-ins for CRDs that the local control plane does not have.
STUB_CRDS = [
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ("cert-manager.io", "Issuer", "issuers"),
    ("cert-manager.io", "Certificate", "certificates"),
]


def variant_flags(name: str, watch_ns: str) -> list[str]:
    return [f.replace("WATCHNS", watch_ns) for f in VARIANTS[name]]


def unique_ns(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------------- CRDs


def test_chart_crds_are_the_repository_crds() -> None:
    link = CHART / "files" / "crds"
    assert link.is_symlink(), "charts/fencedlease/files/crds must be a symlink to ../../../crds"
    assert link.resolve() == CRDS.resolve()
    # Not Helm's crds/ directory: Helm would install it once and never upgrade it.
    assert not (CHART / "crds").exists()
    names = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert names == sorted(p.name for p in link.glob("*.yaml")) and names
    for name in names:
        assert filecmp.cmp(CRDS / name, link / name, shallow=False)


def rendered_crds(*flags: str) -> dict[str, dict[str, Any]]:
    docs = render("fl", "apps", "--show-only", "templates/crds.yaml", *flags)
    return {d["metadata"]["name"]: d for d in kinds(docs, "CustomResourceDefinition")}


def test_the_chart_renders_the_repository_crds_as_templates(tmp_path: Path) -> None:
    """templates/crds.yaml renders each CRD of crds/ unchanged but for the chart's labels and
    ``helm.sh/resource-policy: keep`` (crds.keep); none with crds.enabled false; the packaged
    chart carries the same files."""
    files = {
        p.name.removesuffix(".yaml"): yaml.safe_load(p.read_text()) for p in CRDS.glob("*.yaml")
    }
    got = rendered_crds()
    assert sorted(got) == sorted(files)
    for name, crd in got.items():
        meta = crd["metadata"]
        assert meta["annotations"].pop("helm.sh/resource-policy") == "keep"
        assert meta["labels"].pop("app.kubernetes.io/managed-by") == "Helm"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "fencedlease"
        assert "app.kubernetes.io/instance" not in meta["labels"]  # not one release's
        want = files[name]
        assert crd["spec"] == want["spec"], name
        assert meta["annotations"] == want["metadata"].get("annotations"), name
    loose = rendered_crds("--set", "crds.keep=false")
    assert all(
        "helm.sh/resource-policy" not in c["metadata"]["annotations"] for c in loose.values()
    )
    off = helm("template", "fl", str(CHART), "--set", "crds.enabled=false").stdout
    assert "kind: CustomResourceDefinition" not in off

    helm("package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("fencedlease-*.tgz")
    with tarfile.open(tgz) as tar:
        packaged = {
            Path(m.name).name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name.startswith("fencedlease/files/crds/") and m.isfile()
        }
        assert not [m.name for m in tar.getmembers() if m.name.startswith("fencedlease/crds/")]
    assert packaged == {p.name: p.read_bytes() for p in CRDS.glob("*.yaml")}


# ----------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint(variant: str) -> None:
    result = helm("lint", "--strict", str(CHART), *variant_flags(variant, "apps"), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "replicaCount=2"], "additional properties 'replicaCount' not allowed"),
        (["--set", "webhook.replica=3"], "additional properties 'replica' not allowed"),
        (["--set", "etcd.bundled.enabeld=true"], "additional properties 'enabeld' not allowed"),
        (["--set", "webhook.podAntiAffinity=always"], "podAntiAffinity"),
        (["--set", "controller.replicas=-1"], "controller/replicas"),
        (["--set", "controller.priority=1"], "additional properties 'priority' not allowed"),
        (["--set", "controller.leaderElection.leaseDurationSeconds=1"], "leaseDurationSeconds"),
        (["--set", "etcd.bundled.replicas=2"], "etcd/bundled/replicas"),
        (["--set", "etcd.bundled.enabled=false"], "etcd/endpoints"),
        (["--set", "webhook.tls.secretName=x"], "caBundle"),
        (["--set", "logFormat=xml"], "logFormat"),
        (["--set", "controller.podAntiAffinity=always"], "podAntiAffinity"),
        (["--set", "webhook.securePort=0"], "securePort"),
        (["--set", "webhook.securePort=70000"], "securePort"),
        (["--set", "webhook.hostNetwork=yes"], "hostNetwork"),
        (["--set", "etcd.backup.keep=0"], "etcd/backup/keep"),
        (["--set", "etcd.backup.schedule="], "etcd/backup/schedule"),
        (["--set", "etcd.backup.enabeld=true"], "additional properties 'enabeld' not allowed"),
        (["--set", "networkPolicy.egress.on=true"], "additional properties 'on' not allowed"),
        # Semantic checks of the templates (one line, what to do).
        (
            ["--set", "webhook.hostNetwork=true", "--set", "webhook.securePort=10250"],
            "the kubelet's port",
        ),
        (
            ["--set", "webhook.tls.validityDays=30", "--set", "webhook.tls.renewBeforeDays=30"],
            "renewBeforeDays",
        ),
        (
            ["--set", "webhook.tls.caValidityDays=400"],
            "caValidityDays",
        ),
    ],
)
def test_schema_rejects_bad_values(flags: list[str], message: str) -> None:
    result = helm("template", "x", str(CHART), *flags, check=False)
    assert result.returncode != 0, f"{flags} rendered without error"
    assert message in result.stderr, result.stderr


def test_no_tls_source_fails_with_guidance() -> None:
    result = helm(
        "template", "x", str(CHART), "--set", "webhook.tls.genSelfSigned=false", check=False
    )
    assert result.returncode != 0
    assert "webhook.tls.secretName" in result.stderr


# ------------------------------------------------------------------ rendered structure


def test_default_render_follows_the_contract() -> None:
    docs = render("fencedlease", "fl-system")
    controller = one(docs, "Deployment", "-controller")
    webhook = one(docs, "Deployment", "-webhook")
    assert controller["spec"]["replicas"] == 2  # one leads, one warm standby
    assert controller["spec"]["strategy"]["type"] == "RollingUpdate"
    (cc,) = controller["spec"]["template"]["spec"]["containers"]
    cenv = {e["name"]: e.get("value") for e in cc["env"]}
    assert cenv["FENCEDLEASE_LEADER_ELECTION_NAME"] == "fencedlease-controller"
    assert cenv["FENCEDLEASE_LEADER_ELECTION_NAMESPACE"] == "fl-system"
    assert cenv["FENCEDLEASE_LEADER_ELECTION_LEASE_DURATION_SECONDS"] == "5"
    assert "FENCEDLEASE_PRIORITY" not in cenv
    assert "POD_NAME" in cenv  # part of each replica's election identity
    assert webhook["spec"]["replicas"] >= 2
    assert "podAntiAffinity" in webhook["spec"]["template"]["spec"]["affinity"]
    pdb = one(docs, "PodDisruptionBudget", "-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == webhook["spec"]["selector"]["matchLabels"]

    for dep, role in ((controller, "controller"), (webhook, "webhook")):
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["args"] == ["run", "--role", role]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["FENCEDLEASE_ROLE"] == role
        assert env["FENCEDLEASE_WEBHOOK_REGISTRATION"] == "none"
        assert env["FENCEDLEASE_ETCD_ENDPOINTS"].count("https://") == 3
        assert env["FENCEDLEASE_ETCD_CA_FILE"] == "/etc/fencedlease/etcd/ca.crt"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert env["FENCEDLEASE_HEALTH_ETCD_LIVENESS_SECONDS"] == "120"
        assert env["FENCEDLEASE_HEALTH_ETCD_READINESS_SECONDS"] == "10"
        assert env["FENCEDLEASE_HEALTH_SCHEDULER_STALL_SECONDS"] == "60"
        assert env["FENCEDLEASE_HEALTH_WATCH_GRACE_SECONDS"] == "60"
        assert c["resources"]["requests"]
    (wc,) = webhook["spec"]["template"]["spec"]["containers"]
    wenv = {e["name"]: e.get("value") for e in wc["env"]}
    assert wenv["FENCEDLEASE_WEBHOOK_PORT"] == "9443"
    assert wenv["FENCEDLEASE_WEBHOOK_CERT_DIR"] == "/etc/fencedlease/webhook-tls"
    tls_mount = next(m for m in wc["volumeMounts"] if m["name"] == "webhook-tls")
    assert "subPath" not in tls_mount, "subPath mounts never see renewed certificates"

    mwc = one(docs, "MutatingWebhookConfiguration")
    hook, release, claim = mwc["webhooks"]  # one entry per review kind, each its own path
    svc = one(docs, "Service", "-webhook")
    assert svc["spec"]["ports"][0]["port"] == 443
    assert svc["spec"]["ports"][0]["targetPort"] == "webhook"
    routed = {
        w["name"]: (
            w["clientConfig"]["service"],
            [(r["resources"], r["operations"]) for r in w["rules"]],
        )
        for w in mwc["webhooks"]
    }
    service = {"name": svc["metadata"]["name"], "namespace": "fl-system", "port": 443}
    assert routed == {
        "fence.fencedlease.io": (
            {**service, "path": "/fence"},
            [(["fencedartifacts", "fencedartifacts/status"], ["CREATE", "UPDATE"])],
        ),
        "release.fencedlease.io": (
            {**service, "path": "/fence-release"},
            [(["fencedreleases"], ["CREATE"])],
        ),
        "claim.fencedlease.io": (
            {**service, "path": "/fence-claim"},
            [(["fencedclaims"], ["CREATE", "DELETE"])],
        ),
    }
    assert "url" not in hook["clientConfig"]
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == ["fencedlease.io"] and rule["apiVersions"] == ["v1alpha1"]
    for other in (release, claim):
        for key in ("failurePolicy", "sideEffects", "reinvocationPolicy", "timeoutSeconds"):
            assert other[key] == hook[key], key
        assert other["clientConfig"].get("caBundle") == hook["clientConfig"].get("caBundle")
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["timeoutSeconds"] == 5
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    env = {e["name"]: e.get("value") for e in wc["env"]}
    assert env["FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME"] == mwc["metadata"]["name"]

    sts = one(docs, "StatefulSet", "-etcd")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["volumeClaimTemplates"]
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    for flag in ("--client-cert-auth=true", "--peer-client-cert-auth=true"):
        assert flag in args
    assert sum(a.startswith("--initial-cluster=") and a.count("https://") == 3 for a in args) == 1
    headless = one(docs, "Service", "-etcd-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True


def test_only_holder_pods_write_unless_writers_are_named() -> None:
    def writers(*flags: str) -> str | None:
        docs = render("fencedlease", "fl-system", *flags)
        (c,) = one(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"]
        env: dict[str, str | None] = {e["name"]: e.get("value") for e in c["env"]}
        return env["FENCEDLEASE_ALLOWED_WRITERS"]

    assert writers() == ""
    named = writers("--set", "allowedWriters={system:serviceaccount:ci:publisher,group:ops}")
    assert named == "system:serviceaccount:ci:publisher,group:ops"


def test_the_webhook_answers_within_the_configured_timeout() -> None:
    def timeouts(*flags: str) -> tuple[int, str | None]:
        docs = render("fencedlease", "fl-system", *flags)
        hook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
        (c,) = one(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        return hook["timeoutSeconds"], env["FENCEDLEASE_WEBHOOK_TIMEOUT_SECONDS"]

    assert timeouts() == (5, "5")
    assert timeouts("--set", "webhook.timeoutSeconds=2") == (2, "2")


def test_a_stopping_webhook_drains_within_its_grace_period() -> None:
    def drain(*flags: str) -> tuple[str | None, int]:
        docs = render("fencedlease", "fl-system", *flags)
        spec = one(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        return env["FENCEDLEASE_WEBHOOK_DRAIN_SECONDS"], spec["terminationGracePeriodSeconds"]

    assert drain() == ("5", 30)
    # The drain, then reviews in flight (2 x (timeout + 1) s), must fit in the grace period.
    assert drain("--set", "webhook.drainSeconds=15", "--set", "webhook.timeoutSeconds=30") == (
        "15",
        15 + 2 * 31 + 5,
    )


def test_network_policies_and_the_signing_key() -> None:
    docs = render("fencedlease", "fl-system")
    policies = {p["metadata"]["name"]: p for p in kinds(docs, "NetworkPolicy")}
    assert set(policies) == {
        "fencedlease-webhook",
        "fencedlease-controller",
        "fencedlease-etcd",
        "fencedlease-etcd-backup",
    }
    etcd_from = [
        peer
        for rule in policies["fencedlease-etcd"]["spec"]["ingress"][:2]
        for peer in rule["from"]
    ]
    components = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in etcd_from}
    # Nobody else reaches etcd's client port.
    assert components == {"controller", "webhook", "etcd", "etcd-backup"}
    source = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    narrowed = render(
        "fencedlease",
        "fl-system",
        "--set-json",
        f"networkPolicy.webhookSources={json.dumps(source)}",
    )
    webhook = one(narrowed, "NetworkPolicy", "-webhook")
    assert webhook["spec"]["ingress"][0]["from"] == source
    off = render("fencedlease", "fl-system", "--set", "networkPolicy.enabled=false")
    assert not kinds(off, "NetworkPolicy")
    key = one(docs, "Secret", "-authority")
    assert key["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    controller = one(docs, "Deployment", "-controller")["spec"]["template"]["spec"]
    (c,) = controller["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "authority")
    assert env["FENCEDLEASE_TOKEN_KEY_FILE"] == f"{mount['mountPath']}/token-key"
    volume = next(v for v in controller["volumes"] if v["name"] == "authority")
    assert volume["secret"]["secretName"] == key["metadata"]["name"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_workload_is_restricted(variant: str) -> None:
    docs = render("fencedlease", "fl-system", *variant_flags(variant, "apps"))
    workloads = kinds(docs, "Deployment") + kinds(docs, "StatefulSet")
    workloads += [c["spec"]["jobTemplate"] for c in kinds(docs, "CronJob")]
    assert workloads
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes["tmp"]
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


def test_generated_webhook_certificate_matches_the_ca_bundle() -> None:
    from cryptography import x509

    docs = render("fencedlease", "fl-system")
    mwc = one(docs, "MutatingWebhookConfiguration")
    secret = one(docs, "Secret", "-webhook-tls")
    ca_bundle = mwc["webhooks"][0]["clientConfig"]["caBundle"]
    assert ca_bundle == secret["data"]["ca.crt"], "caBundle and Secret rendered from two CAs"
    ca = x509.load_pem_x509_certificate(base64.b64decode(ca_bundle))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fencedlease-webhook.fl-system.svc" in sans.get_values_for_type(x509.DNSName)


def test_generated_webhook_certificate_is_ecdsa_p256() -> None:
    """The generated serving key (and its CA) are ECDSA P-256, not genSignedCert's RSA 2048:
    every TLS handshake the API server opens costs the webhook one P-256 signature, several
    times cheaper than an RSA one (docs/performance.md, "The fenced write: nearly free")."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    secret = one(render("fencedlease", "fl-system"), "Secret", "-webhook-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    key = load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), password=None)
    for public in (ca.public_key(), leaf.public_key(), key.public_key()):
        assert isinstance(public, ec.EllipticCurvePublicKey), type(public)
        assert isinstance(public.curve, ec.SECP256R1), public.curve.name
    assert key.public_key() == leaf.public_key(), "tls.key does not belong to tls.crt"


def test_cert_manager_mode_injects_the_ca() -> None:
    docs = render("fencedlease", "fl-system", "--set", "certManager.enabled=true")
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    ref = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    ns, name = ref.split("/")
    cert = one(docs, "Certificate", name.removeprefix("fencedlease"))
    assert cert["metadata"]["name"] == name and ns == "fl-system"
    webhook = one(docs, "Deployment", "-webhook")
    volume = next(
        v for v in webhook["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls"
    )
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    secrets = [s["metadata"]["name"] for s in kinds(docs, "Secret")]
    # The status-signing key is not TLS material: cert-manager has nothing to do with it.
    assert secrets == ["fencedlease-authority"], "cert-manager mode must not render TLS keys"
    check_cert_manager_specs(docs)


def test_monitoring_rules_cover_the_required_alerts() -> None:
    docs = render("fencedlease", "fl-system", "--set", "monitoring.enabled=true")
    check_monitoring_specs(docs)
    rule = one(docs, "PrometheusRule")
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert (
        'fencedlease_fence_results_total{result="stale_fence"}'
        in exprs["FencedLeaseStaleFenceRejected"]
    )
    assert exprs["FencedLeaseStaleFenceRejected"].rstrip().endswith("> 0")
    assert "fencedlease_grants_total" in exprs["FencedLeaseChurnSpike"]
    assert "fencedlease_etcd_errors_total" in exprs["FencedLeaseEtcdUnavailable"]
    assert 'code="restore_guard"' in exprs["FencedLeaseRestoreGuard"]
    assert "fencedlease_controller_leader" in exprs["FencedLeaseControllerNoLeader"]
    assert 'result="unavailable"' in exprs["FencedLeaseRenewalsFailing"]
    assert 'phase="Pending"' in exprs["FencedLeaseGrantsStalled"]
    assert 'reason="unrestorable"' in exprs["FencedLeaseWebhookConfigurationUnrestorable"]
    assert 'reason=~"altered|deleted"' in exprs["FencedLeaseWebhookConfigurationLoosened"]
    # Near the webhook's timeout: 80 % of webhook.timeoutSeconds (default 5 s).
    assert exprs["FencedLeaseWebhookSlow"].rstrip().endswith("> 4")
    (monitor,) = [
        m for m in kinds(docs, "ServiceMonitor") if m["metadata"]["name"] == "fencedlease"
    ]
    metrics_svc = one(docs, "Service", "-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= metrics_svc["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == metrics_svc["spec"]["ports"][0]["name"]
    # The metrics Service selects both roles' Pods.
    for dep in kinds(docs, "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert metrics_svc["spec"]["selector"].items() <= labels.items()


def test_every_alert_has_a_runbook_url_to_its_section_in_the_operations_guide() -> None:
    docs = render(
        "fencedlease",
        "fl-system",
        "--set",
        "monitoring.enabled=true",
        "--set",
        "monitoring.rules.runbookUrl=https://runbooks.example.com/fencedlease",
    )
    rules = [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    # GitHub's anchors for headings: lower case, spaces to dashes, punctuation dropped.
    anchors = {
        re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in guide.splitlines()
        if line.startswith("#")
    }
    assert rules
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == "https://runbooks.example.com/fencedlease", url
        assert anchor == rule["alert"].lower() and anchor in anchors, (
            f"{rule['alert']}: no section #{anchor} in docs/operations.md"
        )


def operator_metric_names() -> set[str]:
    """Every series name fencedlease.metrics exposes (counters as ``_total``, histograms as
    ``_bucket``/``_sum``/``_count``), from the prometheus_client registry itself."""
    metrics = pytest.importorskip("fencedlease.metrics")
    from prometheus_client import REGISTRY

    names: set[str] = set()
    for family in REGISTRY.collect():
        if not family.name.startswith(f"{metrics.NAMESPACE}_"):
            continue  # process_*, python_*: not fencedlease's
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}_{part}" for part in ("bucket", "sum", "count"))
        else:
            assert family.type == "gauge", family
            names.add(family.name)
    assert len(names) > 20
    return names


# Words of PromQL that are neither metric names nor followed by "(" (function calls are).
PROMQL_WORDS = frozenset({"and", "or", "unless", "bool", "offset"})


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: strings, label matchers, range and
    subquery brackets, grouping label lists and function names are dropped first."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^{}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    return {
        m.group(1)
        for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text)
        if not m.group(2) and m.group(1) not in PROMQL_WORDS
    }


def test_promql_metric_names_finds_every_selector_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(fencedlease_x_bucket{job=~"$job", '
        'a="b{c}"}[$__rate_interval]))) > 0.8 and on (namespace) sum(up) by (pod) '
        "or max_over_time(fencedlease_y[5m:1m]) offset 1h unless vector(1) * 1e3"
    )
    assert promql_metric_names(expr) == {"fencedlease_x_bucket", "up", "fencedlease_y"}
    # A typo is a name the operator does not expose: the dashboard test reports it.
    typo = promql_metric_names("sum(rate(fencedlease_grant_total[5m]))")
    assert typo == {"fencedlease_grant_total"} and not typo <= operator_metric_names()


def test_alert_metric_names_exist_in_the_operator() -> None:
    exposed = operator_metric_names()
    docs = render("fencedlease", "fl-system", "--set", "monitoring.enabled=true")
    rules = [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    used = set().union(*(promql_metric_names(r["expr"]) for r in rules))
    # Series of others: Prometheus' own `up` per scrape target (the alerts on Pods that are
    # all gone) and kube-state-metrics' CronJob success time (the etcd backup alert).
    external = {"up", "kube_cronjob_status_last_successful_time"}
    assert used and used <= exposed | external, (
        f"alerts use metrics the operator does not expose: {used - exposed - external}"
    )
    text = json.dumps(one(docs, "PrometheusRule")["spec"])  # descriptions name metrics too
    named = set(re.findall(r"fencedlease_[a-z_]+", text))
    assert named <= exposed, f"alerts name metrics the operator does not expose: {named - exposed}"


# ------------------------------------------------------------------ Grafana dashboard


def dashboard_panels(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard, rows' nested panels included."""
    found = []
    for panel in node.get("panels", []):
        found.append(panel)
        found.extend(dashboard_panels(panel))
    return found


def test_dashboard_is_opt_in_and_carries_the_sidecar_label() -> None:
    assert not kinds(render("fencedlease", "fl-system"), "ConfigMap")
    assert not kinds(
        render("fencedlease", "fl-system", "--set", "monitoring.enabled=true"), "ConfigMap"
    )
    docs = render("fencedlease", "fl-system", "--set", "monitoring.dashboard.enabled=true")
    cm = one(docs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["namespace"] == "fl-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]
    assert not kinds(docs, "ServiceMonitor"), "the dashboard alone needs no Prometheus Operator"
    shipped = (CHART / "dashboards" / "fencedlease.json").read_text()
    assert json.loads(cm["data"]["fencedlease.json"]) == json.loads(shipped)

    custom = render(
        "fencedlease",
        "fl-system",
        "--set",
        "monitoring.dashboard.enabled=true",
        "--set",
        "monitoring.dashboard.namespace=grafana",
        "--set",
        "monitoring.dashboard.sidecarLabel=example.com/dashboard",
        "--set",
        "monitoring.dashboard.sidecarLabelValue=fencedlease",
        "--set",
        "monitoring.dashboard.labels.team=storage",
        "--set",
        "monitoring.dashboard.annotations.grafana_folder=Storage",
    )
    meta = one(custom, "ConfigMap", "-dashboard")["metadata"]
    assert meta["namespace"] == "grafana"
    assert meta["labels"]["example.com/dashboard"] == "fencedlease"
    assert "grafana_dashboard" not in meta["labels"] and meta["labels"]["team"] == "storage"
    assert meta["annotations"] == {"grafana_folder": "Storage"}
    bad = helm(
        "template", "x", str(CHART), "--set", "monitoring.dashboard.sidecarLabel=a b", check=False
    )
    assert bad.returncode != 0 and "sidecarLabel" in bad.stderr


def test_dashboard_queries_only_metrics_the_operator_exposes() -> None:
    exposed = operator_metric_names()
    docs = render("fencedlease", "fl-system", "--set", "monitoring.dashboard.enabled=true")
    dashboard = json.loads(one(docs, "ConfigMap", "-dashboard")["data"]["fencedlease.json"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job"):
        query = variables[name]["query"]
        query = query["query"] if isinstance(query, dict) else query
        (metric,) = re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)", query)
        assert metric in exposed, f"variable {name} queries {metric}"
        assert variables[name]["datasource"]["uid"] == "${datasource}"

    panels = [p for p in dashboard_panels(dashboard) if p["type"] != "row"]
    assert panels
    assert len({p["id"] for p in dashboard_panels(dashboard)}) == len(dashboard_panels(dashboard))
    used: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            names = promql_metric_names(target["expr"])
            assert names, f"{panel['title']}: no metric in {target['expr']!r}"
            unknown = names - exposed
            assert not unknown, f"{panel['title']}: the operator does not expose {unknown}"
            assert '$namespace"' in target["expr"] and "$job" in target["expr"], panel["title"]
            used |= names
    # The rows promised in docs/operations.md ("Dashboard").
    for metric in (
        "grants_total",
        "renewals_total",
        "fence_results_total",
        "admission_latency_seconds_bucket",
        "leases",
        "controller_leader",
        "etcd_errors_total",
        "acquire_unavailable_total",
        "reconciles_total",
        "reconcile_errors_total",
        "reconcile_duration_seconds_bucket",
        "scheduler_queue_depth",
        "scheduler_lateness_seconds_bucket",
        "webhook_configuration_restores_total",
        "build_info",
    ):
        assert f"fencedlease_{metric}" in used, f"no panel shows fencedlease_{metric}"
    quantiles = {
        q
        for p in panels
        for t in p["targets"]
        if "admission_latency" in t["expr"]
        for q in re.findall(r"histogram_quantile\((0\.\d+)", t["expr"])
    }
    assert quantiles == {"0.5", "0.99"}


# ----------------------------------------------------------------- bundled etcd metrics


def test_bundled_etcd_compacts_and_has_a_quota_and_the_operator_gets_the_retention() -> None:
    """etcd stays bounded (docs/operations.md, "etcd maintenance"; docs/tokens.md,
    "Retention"): auto-compaction and a backend quota on the bundled etcd, the retention
    rule's parameters in the operator's environment."""
    docs = render("fencedlease", "fl-system")
    (c,) = one(docs, "StatefulSet", "-etcd")["spec"]["template"]["spec"]["containers"]
    assert "--auto-compaction-mode=periodic" in c["args"]
    assert "--auto-compaction-retention=1h" in c["args"]
    assert "--quota-backend-bytes=1073741824" in c["args"]
    docs = render(
        "fencedlease",
        "fl-system",
        "--set",
        "etcd.bundled.compaction.mode=revision",
        "--set-string",
        "etcd.bundled.compaction.retention=10000",
        "--set",
        "etcd.bundled.quotaBackendBytes=4294967296",
        "--set",
        "etcd.retention.tokenGenerations=4",
        "--set",
        "etcd.retention.deletedLeaseSeconds=600",
    )
    (c,) = one(docs, "StatefulSet", "-etcd")["spec"]["template"]["spec"]["containers"]
    assert "--auto-compaction-mode=revision" in c["args"]
    assert "--auto-compaction-retention=10000" in c["args"]
    assert "--quota-backend-bytes=4294967296" in c["args"]
    envs = [
        {e["name"]: e.get("value") for e in container.get("env", [])}
        for deployment in kinds(docs, "Deployment")
        for container in deployment["spec"]["template"]["spec"]["containers"]
    ]
    operators = [env for env in envs if "FENCEDLEASE_ETCD_PREFIX" in env]
    assert operators, "no operator container found"
    for env in operators:
        assert env["FENCEDLEASE_TOKEN_RETENTION_GENERATIONS"] == "4"
        assert env["FENCEDLEASE_DELETED_LEASE_RETENTION_SECONDS"] == "600"


def test_bundled_etcd_metrics_are_scraped_over_plain_http() -> None:
    docs = render("fencedlease", "fl-system", "--set", "monitoring.enabled=true")
    (c,) = one(docs, "StatefulSet", "-etcd")["spec"]["template"]["spec"]["containers"]
    assert "--listen-metrics-urls=http://0.0.0.0:2381" in c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == 2381
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics", probe  # no client certificate needed
    monitor = one(docs, "ServiceMonitor", "-etcd")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "http"
    assert endpoint["path"] == "/metrics" and "tlsConfig" not in endpoint
    selected = [
        svc
        for svc in kinds(docs, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ]
    # The headless Service: every member, Ready or not (a member without quorum is not Ready).
    assert [svc["metadata"]["name"] for svc in selected] == ["fencedlease-etcd-headless"]
    (svc,) = selected
    assert svc["spec"]["publishNotReadyAddresses"] is True
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["metrics"]["port"] == 2381 and svc_ports["metrics"]["targetPort"] == "metrics"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["fl-system"]
    check_monitoring_specs(docs)
    # Reachable through the NetworkPolicy like the operator's metrics ports (any source).
    policy = one(docs, "NetworkPolicy", "-etcd")
    open_ports = {
        p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]
    }
    assert open_ports == {2381}

    for flags in (
        [],
        ["--set", "monitoring.enabled=true", "--set", "monitoring.etcd.enabled=false"],
        ["--set", "monitoring.enabled=true", *VARIANTS["external-etcd"]],
    ):
        names = [
            m["metadata"]["name"]
            for m in kinds(render("fencedlease", "fl-system", *flags), "ServiceMonitor")
        ]
        assert names == ([] if not flags else ["fencedlease"]), flags


def check_cert_manager_specs(docs: list[dict[str, Any]]) -> None:
    """Client-side: the fields cert-manager's v1 API requires (stub CRDs do not check them)."""
    for cert in kinds(docs, "Certificate"):
        spec = cert["spec"]
        assert spec["secretName"] and spec["issuerRef"]["name"]
        assert spec.get("dnsNames") or spec.get("commonName") or spec.get("isCA")
    for issuer in kinds(docs, "Issuer"):
        assert len(issuer["spec"]) == 1 and next(iter(issuer["spec"])) in {"selfSigned", "ca"}
    issuers = {i["metadata"]["name"] for i in kinds(docs, "Issuer")}
    for cert in kinds(docs, "Certificate"):
        assert cert["spec"]["issuerRef"]["name"] in issuers


def check_monitoring_specs(docs: list[dict[str, Any]]) -> None:
    """Client-side: the fields the Prometheus Operator's v1 API requires."""
    for monitor in kinds(docs, "ServiceMonitor"):
        assert monitor["spec"]["selector"]["matchLabels"]
        assert all(e["port"] for e in monitor["spec"]["endpoints"])
    for rule in kinds(docs, "PrometheusRule"):
        for group in rule["spec"]["groups"]:
            assert group["name"]
            for r in group["rules"]:
                assert (
                    r["alert"]
                    and r["expr"]
                    and set(r)
                    <= {
                        "alert",
                        "expr",
                        "for",
                        "labels",
                        "annotations",
                    }
                )


# ------------------------------------------------------------- server-side dry-run


@pytest.fixture(scope="module")
def stub_crds(cluster: Any) -> None:
    for group, kind, plural in STUB_CRDS:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "listKind": f"{kind}List"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(crd))
    names = [f"crd/{plural}.{group}" for group, _, plural in STUB_CRDS]
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_manifests_pass_server_side_dry_run(
    cluster: Any, stub_crds: None, variant: str
) -> None:
    release_ns = unique_ns("chart")
    watch_ns = unique_ns("apps")
    for ns in (release_ns, watch_ns):
        cluster.kubectl("create", "namespace", ns)
    flags = variant_flags(variant, watch_ns)
    manifest = helm(
        "template",
        f"fl-{uuid.uuid4().hex[:6]}",
        str(CHART),
        "--namespace",
        release_ns,
        "--include-crds",
        *flags,
    ).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(docs) > 10
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert result.returncode == 0, result.stderr
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("Warning:") and "last-applied-configuration" not in line
    ]
    assert not warnings, warnings  # e.g. an env var defined twice
    applied = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(docs), result.stdout


# ------------------------------------------------------------------------------- RBAC


def can_i(cluster: Any, sa: str, verb: str, resource: str, namespace: str, name: str = "") -> bool:
    """``kubectl auth can-i`` as ``sa``; ``resource`` may be ``plural.group/subresource``."""
    plural, _, sub = resource.partition("/")
    target = f"{plural}/{name}" if name else plural
    args = ["auth", "can-i", verb, target, "--as", sa]
    args += ["-n", namespace] if namespace else []
    args += [f"--subresource={sub}"] if sub else []
    result = cluster.kubectl(*args, check=False)
    answer: str = result.stdout.strip()
    assert answer in {"yes", "no"}, result.stdout + result.stderr
    return answer == "yes"


CONTROLLER_ALLOWED = [
    ("get", "fencedleases.fencedlease.io"),
    ("list", "fencedleases.fencedlease.io"),
    ("watch", "fencedleases.fencedlease.io"),
    ("patch", "fencedleases.fencedlease.io"),
    ("patch", "fencedleases.fencedlease.io/status"),
    ("update", "fencedleases.fencedlease.io/status"),
    # An item's lease for claims (FencedClaim): made from its template, deleted once unclaimed.
    ("create", "fencedleases.fencedlease.io"),
    ("delete", "fencedleases.fencedlease.io"),
    ("watch", "fencedreleases.fencedlease.io"),
    ("patch", "fencedreleases.fencedlease.io/status"),
    ("watch", "fencedclaims.fencedlease.io"),
    ("patch", "fencedclaims.fencedlease.io/status"),
    ("list", "fencedartifacts.fencedlease.io"),
    ("watch", "fencedartifacts.fencedlease.io"),
    ("patch", "fencedartifacts.fencedlease.io"),  # the high-water-mark finalizer
    ("patch", "fencedartifacts.fencedlease.io/status"),
    ("list", "pods"),
    ("watch", "pods"),
    ("patch", "pods"),
    ("create", "events"),
    ("create", "events.events.k8s.io"),
]
CONTROLLER_FORBIDDEN = [
    ("get", "secrets"),
    ("delete", "pods"),
    ("create", "pods"),
    ("update", "fencedartifacts.fencedlease.io"),
    ("create", "fencedreleases.fencedlease.io"),  # only holder Pods release
    ("create", "fencedclaims.fencedlease.io"),  # only worker Pods claim
    ("create", "serviceaccounts/token"),
]
WEBHOOK_ALLOWED = [
    ("get", "fencedleases.fencedlease.io"),
    ("list", "fencedleases.fencedlease.io"),
    ("watch", "fencedleases.fencedlease.io"),
    ("create", "events"),
]
WEBHOOK_FORBIDDEN = [
    ("patch", "fencedleases.fencedlease.io"),
    ("patch", "fencedleases.fencedlease.io/status"),
    ("list", "pods"),
    ("get", "secrets"),
    ("patch", "fencedartifacts.fencedlease.io"),
]
PUBLISHER_ALLOWED = [
    ("create", "fencedartifacts.fencedlease.io"),
    ("update", "fencedartifacts.fencedlease.io"),
    ("patch", "fencedartifacts.fencedlease.io"),
    ("get", "fencedartifacts.fencedlease.io"),
    ("watch", "fencedleases.fencedlease.io"),
    ("create", "fencedreleases.fencedlease.io"),
    ("create", "fencedclaims.fencedlease.io"),
    ("delete", "fencedclaims.fencedlease.io"),
]
PUBLISHER_FORBIDDEN = [
    ("update", "fencedartifacts.fencedlease.io/status"),
    ("patch", "fencedartifacts.fencedlease.io/status"),
    ("delete", "fencedartifacts.fencedlease.io"),
    ("patch", "fencedleases.fencedlease.io"),
    ("patch", "fencedleases.fencedlease.io/status"),
    ("create", "fencedleases.fencedlease.io"),
    ("patch", "fencedclaims.fencedlease.io/status"),
    ("get", "secrets"),
]


def apply_rbac(cluster: Any, release_ns: str, *flags: str) -> tuple[str, list[dict[str, Any]]]:
    fullname = f"rb{uuid.uuid4().hex[:8]}"
    docs = render(fullname, release_ns, "--set", f"fullnameOverride={fullname}", *flags)
    rbac_kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    rbac = [d for d in docs if d["kind"] in rbac_kinds]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return fullname, docs


def check_verbs(
    cluster: Any, sa: str, ns: str, allowed: list[tuple[str, str]], forbidden: list[Any]
) -> None:
    wrong_no = [(v, r) for v, r in allowed if not can_i(cluster, sa, v, r, ns)]
    wrong_yes = [(v, r) for v, r in forbidden if can_i(cluster, sa, v, r, ns)]
    assert not wrong_no, f"{sa} lacks {wrong_no}"
    assert not wrong_yes, f"{sa} may {wrong_yes}"


def test_rbac_grants_exactly_what_the_roles_need(cluster: Any) -> None:
    release_ns, other_ns = unique_ns("rbac"), unique_ns("other")
    for ns in (release_ns, other_ns):
        cluster.kubectl("create", "namespace", ns)
    fullname, docs = apply_rbac(cluster, release_ns)
    controller = f"system:serviceaccount:{release_ns}:{fullname}-controller"
    webhook = f"system:serviceaccount:{release_ns}:{fullname}-webhook"
    for ns in (release_ns, other_ns):  # cluster-wide install
        check_verbs(cluster, controller, ns, CONTROLLER_ALLOWED, CONTROLLER_FORBIDDEN)
        check_verbs(cluster, webhook, ns, WEBHOOK_ALLOWED, WEBHOOK_FORBIDDEN)

    mwc = one(docs, "MutatingWebhookConfiguration")["metadata"]["name"]
    for verb in ("get", "update", "patch"):
        assert can_i(cluster, controller, verb, "mutatingwebhookconfigurations", "", name=mwc)
        assert not can_i(
            cluster, controller, verb, "mutatingwebhookconfigurations", "", name="someone-else"
        )
        assert not can_i(cluster, webhook, verb, "mutatingwebhookconfigurations", "", name=mwc)
    assert not can_i(cluster, controller, "delete", "mutatingwebhookconfigurations", "", name=mwc)
    # No create by default (it cannot be limited by name); the guard reads only its Service.
    assert not can_i(cluster, controller, "create", "mutatingwebhookconfigurations", "")
    service = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]
    assert can_i(cluster, controller, "get", "services", release_ns, name=service["name"])
    assert not can_i(cluster, controller, "get", "services", release_ns, name="someone-else")
    assert not can_i(cluster, controller, "list", "services", release_ns)
    assert can_i(cluster, controller, "list", "customresourcedefinitions", "")
    assert not can_i(cluster, controller, "update", "customresourcedefinitions", "")
    assert can_i(cluster, controller, "watch", "namespaces", "")
    # The election Lease: its own in the release namespace, nobody else's.
    election = f"{fullname}-controller"
    for verb in ("get", "update"):
        assert can_i(cluster, controller, verb, "leases.coordination.k8s.io", release_ns, election)
        assert not can_i(cluster, controller, verb, "leases.coordination.k8s.io", release_ns, "x")
        assert not can_i(cluster, webhook, verb, "leases.coordination.k8s.io", release_ns, election)
    assert can_i(cluster, controller, "create", "leases.coordination.k8s.io", release_ns)
    assert not can_i(cluster, controller, "create", "leases.coordination.k8s.io", other_ns)
    assert not can_i(cluster, controller, "delete", "leases.coordination.k8s.io", release_ns)

    # Workloads: bind the publisher ClusterRole to an app's ServiceAccount in one namespace.
    app_sa = f"system:serviceaccount:{other_ns}:worker"
    cluster.kubectl("create", "serviceaccount", "worker", "-n", other_ns)
    cluster.kubectl(
        "create",
        "rolebinding",
        "publish",
        f"--clusterrole={fullname}-publisher",
        f"--serviceaccount={other_ns}:worker",
        "-n",
        other_ns,
    )
    check_verbs(cluster, app_sa, other_ns, PUBLISHER_ALLOWED, PUBLISHER_FORBIDDEN)
    assert not can_i(cluster, app_sa, "create", "fencedartifacts.fencedlease.io", release_ns)


def test_restore_deleted_grants_create_on_webhook_configurations(cluster: Any) -> None:
    release_ns = unique_ns("rbac")
    cluster.kubectl("create", "namespace", release_ns)
    fullname, _ = apply_rbac(cluster, release_ns, "--set", "webhook.guard.restoreDeleted=true")
    controller = f"system:serviceaccount:{release_ns}:{fullname}-controller"
    webhook = f"system:serviceaccount:{release_ns}:{fullname}-webhook"
    assert can_i(cluster, controller, "create", "mutatingwebhookconfigurations", "")
    assert not can_i(cluster, webhook, "create", "mutatingwebhookconfigurations", "")
    assert not can_i(cluster, controller, "delete", "mutatingwebhookconfigurations", "")


def test_the_webhook_reads_declared_kinds_only_to_decide_scale_writes(cluster: Any) -> None:
    """docs/fenced-objects.md, "Scale writes": a Scale carries no labels, so the webhook GETs
    the scaled object; it may get the kinds of ``fencedObjects.resources`` and nothing more."""
    release_ns = unique_ns("rbac")
    cluster.kubectl("create", "namespace", release_ns)
    flags = ("--set", "fencedObjects.resources[0].apiGroup=apps",
             "--set", "fencedObjects.resources[0].resources[0]=deployments")  # fmt: skip
    fullname, _ = apply_rbac(cluster, release_ns, *flags)
    webhook = f"system:serviceaccount:{release_ns}:{fullname}-webhook"
    assert can_i(cluster, webhook, "get", "deployments.apps", release_ns)
    refused = [
        ("list", "deployments.apps"),
        ("patch", "deployments.apps"),
        ("update", "deployments.apps/scale"),
        ("get", "configmaps"),
    ]
    for verb, resource in refused:
        assert not can_i(cluster, webhook, verb, resource, release_ns), (verb, resource)


def test_namespace_scoped_rbac_stays_in_its_namespace(cluster: Any) -> None:
    release_ns, watch_ns, other_ns = unique_ns("rbac"), unique_ns("watch"), unique_ns("other")
    for ns in (release_ns, watch_ns, other_ns):
        cluster.kubectl("create", "namespace", ns)
    fullname, docs = apply_rbac(cluster, release_ns, "--set", f"watchNamespace={watch_ns}")
    controller = f"system:serviceaccount:{release_ns}:{fullname}-controller"
    webhook = f"system:serviceaccount:{release_ns}:{fullname}-webhook"
    check_verbs(cluster, controller, watch_ns, CONTROLLER_ALLOWED, CONTROLLER_FORBIDDEN)
    check_verbs(cluster, webhook, watch_ns, WEBHOOK_ALLOWED, WEBHOOK_FORBIDDEN)
    for verb, resource in CONTROLLER_ALLOWED:
        assert not can_i(cluster, controller, verb, resource, other_ns), (verb, resource)
    assert not can_i(cluster, webhook, "list", "fencedleases.fencedlease.io", other_ns)
    hook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": watch_ns}


# ----------------------------------------------------------------------- docs table


def values_table() -> str:
    """Markdown table of every leaf value in values.schema.json with its default."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = ["| key | type | default | description |", "|---|---|---|---|"]

    def walk(node: dict[str, Any], default: Any, path: str) -> None:
        props = node.get("properties")
        if node.get("type") == "object" and props and node.get("additionalProperties") is False:
            for key, sub in props.items():
                walk(sub, (default or {}).get(key), f"{path}.{key}" if path else key)
            return
        kind = node.get("type", "")
        kind = "/".join(kind) if isinstance(kind, list) else kind
        if "enum" in node:
            kind += " (" + ", ".join(str(e) for e in node["enum"]) + ")"
        shown = json.dumps(default, separators=(",", ":")) if default not in ("", None) else '""'
        desc = node.get("description", "").replace("|", "\\|")
        rows.append(f"| `{path}` | {kind} | `{shown}` | {desc} |")

    walk(schema, defaults, "")
    return "\n".join(rows) + "\n"


def test_install_doc_values_table_is_in_sync() -> None:
    text = INSTALL_DOC.read_text()
    assert TABLE_BEGIN in text and TABLE_END in text
    current = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n") + "\n"
    assert current == values_table(), (
        "docs/install.md values table is stale: "
        ".venv/bin/python -m tests.integration.test_chart --write-docs"
    )


def test_schema_and_values_have_the_same_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(defaults)


def _write_docs() -> None:
    text = INSTALL_DOC.read_text()
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    INSTALL_DOC.write_text(f"{head}{TABLE_BEGIN}\n{values_table()}{TABLE_END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        _write_docs()
