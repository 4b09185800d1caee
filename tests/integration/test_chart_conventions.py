"""The chart's conventions for a platform team (cert-manager's and Kyverno's charts as anchors),
against the real helm: a dependency of an umbrella chart (``global``), the bundled etcd's and
each component's scheduling, ``image.digest``, ``extraArgs``, ``serviceAccount.name``, the
Chart.yaml metadata and Artifact Hub's, and a values schema that stays strict elsewhere
(docs/install.md, "Values"). Server-side checks of the same options: ``test_chart.py``'s
``conventions`` variant."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chart import CHART, ROOT, helm, kinds, one, render

pytestmark = pytest.mark.timeout(300)

DIGEST = "sha256:" + "ab" * 32
META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every Pod template of a render, by its object's name."""
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc["kind"] in ("Deployment", "StatefulSet"):
            out[doc["metadata"]["name"]] = spec["template"]["spec"]
        elif doc["kind"] == "CronJob":
            out[doc["metadata"]["name"]] = spec["jobTemplate"]["spec"]["template"]["spec"]
    return out


def images(pod: dict[str, Any]) -> list[str]:
    return [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]


# ------------------------------------------------------------------------- an umbrella chart


def umbrella(tmp_path: Path, values: dict[str, Any]) -> Path:
    """A platform's umbrella chart with this chart as a dependency (``file://``, offline)."""
    root = tmp_path / "platform"
    root.mkdir()
    chart = {
        "apiVersion": "v2",
        "name": "platform",
        "version": "1.0.0",
        "dependencies": [
            {"name": "fencedlease", "version": META["version"], "repository": f"file://{CHART}"}
        ],
    }
    (root / "Chart.yaml").write_text(yaml.safe_dump(chart))
    (root / "values.yaml").write_text(yaml.safe_dump(values))
    helm("dependency", "build", str(root))
    return root


def test_a_dependency_of_an_umbrella_chart_takes_its_globals(tmp_path: Path) -> None:
    """helm#10392: a subchart whose schema rejects ``global`` cannot be a dependency. Here it
    accepts it, any key of it (other charts' globals), and uses imagePullSecrets and
    priorityClassName from it."""
    values = {
        "global": {
            "imagePullSecrets": [{"name": "platform-pull"}, "mirror-pull"],
            "priorityClassName": "platform-critical",
            "storageClass": "fast",  # another chart's global
        },
        "fencedlease": {
            "imagePullSecrets": [{"name": "own-pull"}, {"name": "platform-pull"}],
            "webhook": {"priorityClassName": "system-cluster-critical"},
        },
    }
    root = umbrella(tmp_path, values)
    lint = helm("lint", "--strict", str(root), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = helm("template", "platform", str(root), "--namespace", "platform").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    pods = pod_specs(docs)
    assert len(pods) == 4, sorted(pods)  # controller, webhook, etcd, etcd backup
    for name, pod in pods.items():
        assert pod["imagePullSecrets"] == [
            {"name": "platform-pull"},
            {"name": "mirror-pull"},
            {"name": "own-pull"},
        ], name
        want = "system-cluster-critical" if name.endswith("-webhook") else "platform-critical"
        assert pod["priorityClassName"] == want, name
    assert kinds(docs, "CustomResourceDefinition"), "the dependency installs the CRDs"


# ------------------------------------------------------------------------------- scheduling


def test_the_bundled_etcd_spreads_over_zones_and_takes_scheduling_values(tmp_path: Path) -> None:
    docs = render("fl", "ops")
    sts = one(docs, "StatefulSet", "-etcd")
    pod = sts["spec"]["template"]["spec"]
    spreads = pod["topologySpreadConstraints"]
    keys = [s["topologyKey"] for s in spreads]
    assert keys == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    for spread in spreads:
        assert spread["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    assert "podAntiAffinity" in pod["affinity"]
    assert "priorityClassName" not in pod

    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["etcd"]}]}
                ]
            }
        }
    }
    own_spread = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "x"}},
    }
    bundled = {
        "affinity": affinity,
        "topologySpreadConstraints": [own_spread],
        "priorityClassName": "etcd-critical",
        "tolerations": [{"key": "dedicated", "value": "etcd", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "etcd"},
        "extraArgs": ["--snapshot-count=50000"],
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"etcd": {"bundled": bundled}}))
    docs = render("fl", "ops", "-f", str(values))
    pods = pod_specs(docs)
    etcd = pods["fl-fencedlease-etcd"]
    assert etcd["affinity"] == affinity  # replaces the default anti-affinity
    assert etcd["topologySpreadConstraints"] == [own_spread]  # its own selector kept
    assert etcd["priorityClassName"] == "etcd-critical"
    assert etcd["tolerations"] == bundled["tolerations"]
    assert etcd["nodeSelector"] == {"pool": "etcd"}
    assert etcd["containers"][0]["args"][-1] == "--snapshot-count=50000"
    backup = pods["fl-fencedlease-etcd-backup"]  # runs next to its etcd
    assert backup["priorityClassName"] == "etcd-critical"
    assert backup["nodeSelector"] == {"pool": "etcd"}
    # [] turns a component's spreading off.
    values.write_text(yaml.safe_dump({"controller": {"topologySpreadConstraints": []}}))
    none = render("fl", "ops", "-f", str(values))
    assert "topologySpreadConstraints" not in pod_specs(none)["fl-fencedlease-controller"]


# ---------------------------------------------------------- images, arguments, accounts


def test_images_by_digest_extra_args_and_service_account_names() -> None:
    flags = [
        "--set", f"image.digest={DIGEST}",
        "--set", f"etcd.bundled.image.digest={DIGEST}",
        "--set", "controller.extraArgs={--verbose}",
        "--set", "webhook.extraArgs={--a,--b}",
        "--set", "serviceAccount.name=platform-fl",
    ]  # fmt: skip
    docs = render("fl", "ops", *flags)
    pods = pod_specs(docs)
    for pod in pods.values():
        for image in images(pod):
            assert image.endswith(f"@{DIGEST}") and ":" not in image.split("@")[0].split("/")[-1]
    controller = pods["fl-fencedlease-controller"]["containers"][0]["args"]
    assert controller == ["run", "--role", "controller", "--verbose"]
    assert pods["fl-fencedlease-webhook"]["containers"][0]["args"][-2:] == ["--a", "--b"]
    accounts = {a["metadata"]["name"] for a in kinds(docs, "ServiceAccount")}
    assert accounts == {"platform-fl-controller", "platform-fl-webhook"}
    assert pods["fl-fencedlease-controller"]["serviceAccountName"] == "platform-fl-controller"
    assert pods["fl-fencedlease-webhook"]["serviceAccountName"] == "platform-fl-webhook"
    subjects = {
        s["name"]
        for b in kinds(docs, "ClusterRoleBinding") + kinds(docs, "RoleBinding")
        for s in b.get("subjects") or []
    }
    assert subjects <= accounts and subjects
    # Without a digest: repository:tag, the tag defaulting to appVersion.
    default = pod_specs(render("fl", "ops"))["fl-fencedlease-controller"]
    assert images(default) == [f"ghcr.io/fencedlease/fencedlease:{META['appVersion']}"]


# ---------------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "typo=1"], "typo"),
        (["--set", "controller.extraArg={x}"], "extraArg"),
        (["--set", "etcd.bundled.affinty.x=1"], "affinty"),
        (["--set", "image.digest=latest"], "digest"),
        (["--set", "crds.install=true"], "install"),
        (["--set", "serviceAccount.name=Bad_Name"], "name"),
        (["--set", "controller.topologySpreadConstraints[0].maxSkew=1"], "topologyKey"),
    ],
)
def test_the_schema_stays_strict_outside_global(flags: list[str], message: str) -> None:
    result = helm("template", "fl", str(CHART), *flags, check=False)
    assert result.returncode != 0, f"{flags} was accepted"
    assert message in result.stderr, result.stderr


def test_global_accepts_any_key_but_checks_its_own() -> None:
    helm("template", "fl", str(CHART), "--set", "global.anything.nested=1")
    bad = helm("template", "fl", str(CHART), "--set", "global.priorityClassName[0]=x", check=False)
    assert bad.returncode != 0


# ---------------------------------------------------------------------- Chart.yaml metadata


def test_chart_metadata_and_artifact_hub() -> None:
    assert META["kubeVersion"].startswith(">=1.")
    assert META["sources"] and all(s.startswith("https://") for s in META["sources"])
    assert META["maintainers"] and all(m["name"] for m in META["maintainers"])
    annotations = META["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    listed = {c["name"]: c for c in yaml.safe_load(annotations["artifacthub.io/crds"])}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        entry = listed.pop(crd["metadata"]["name"])
        assert entry["kind"] == crd["spec"]["names"]["kind"]
        assert entry["version"] in [v["name"] for v in crd["spec"]["versions"]]
    assert not listed, f"listed but not in crds/: {sorted(listed)}"
    for link in yaml.safe_load(annotations["artifacthub.io/links"]):
        assert link["name"] and link["url"].startswith("https://")
    repo = yaml.safe_load((ROOT / "charts" / "artifacthub-repo.yml").read_text())
    assert repo["owners"] and all(o["name"] and o["email"] for o in repo["owners"])
    # The license travels with the packaged chart.
    for name in ("LICENSE", "NOTICE"):
        assert (CHART / name).read_bytes() == (ROOT / name).read_bytes()
    # kubeVersion is enforced.
    old = helm("template", "fl", str(CHART), "--kube-version", "1.28.0", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr
    helm("template", "fl", str(CHART), "--kube-version", "1.29.0")


def test_the_packaged_chart_carries_license_readme_and_schema(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("fencedlease-*.tgz")
    listing = subprocess.run(
        ["tar", "tzf", str(tgz)], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in ("LICENSE", "NOTICE", "README.md", "values.schema.json", "templates/crds.yaml"):
        assert f"fencedlease/{name}" in listing, name
    shown = json.loads(json.dumps(yaml.safe_load(helm("show", "chart", str(tgz)).stdout)))
    assert shown["annotations"]["artifacthub.io/license"] == "Apache-2.0"
