"""The in-cluster restore of the chart's bundled etcd: one Pod per member (pure manifests).

Each Pod mounts its member's PVC (``data-<statefulset>-<i>``) and the backup volume; an init
container of the operator image moves the member's old data directory aside (kept, for a look),
then ``etcdutl snapshot restore`` (the etcd image) writes the restored member there with the
revision bump. The StatefulSet, scaled to 0 meanwhile, then starts on the restored data.
Everything comes from the StatefulSet the chart rendered, so names, peer URLs, the cluster token
and the security context are the chart's own (docs/operations.md, "Backup and restore").
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from fencedlease.etcdbackup import plan

LABEL = "fencedlease.io/etcd-restore"


class ManifestError(ValueError):
    """The StatefulSet is not the chart's bundled etcd (a flag or volume is missing)."""


@dataclass(frozen=True)
class EtcdSet:
    """What a restore needs from the chart's etcd StatefulSet."""

    name: str
    namespace: str
    image: str
    helper_image: str
    data_dir: str
    data_mount: str
    claim_prefix: str
    claim_spec: dict[str, Any]
    cluster_token: str
    peer_url_template: str  # with $(POD_NAME)
    members: int
    pod_security: dict[str, Any]
    container_security: dict[str, Any]
    labels: dict[str, str]


def _flag(args: list[str], name: str) -> str:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    raise ManifestError(f"the etcd container has no --{name}: not the chart's bundled etcd")


def read_statefulset(sts: dict[str, Any], helper_image: str) -> EtcdSet:
    """The restore's inputs from the StatefulSet (as the API serves it, camelCase)."""
    meta, spec = sts["metadata"], sts["spec"]
    pod = spec["template"]["spec"]
    etcd = next((c for c in pod["containers"] if c["name"] == "etcd"), None)
    if etcd is None:
        raise ManifestError(f"StatefulSet {meta['name']} has no container named etcd")
    args: list[str] = list(etcd.get("args", []))
    templates = spec.get("volumeClaimTemplates") or []
    if len(templates) != 1:
        raise ManifestError(f"StatefulSet {meta['name']} needs exactly one volumeClaimTemplate")
    claim = templates[0]
    mount = next(
        (m for m in etcd.get("volumeMounts", []) if m["name"] == claim["metadata"]["name"]), None
    )
    if mount is None:
        raise ManifestError("the etcd container does not mount its volumeClaimTemplate")
    members = len(_flag(args, "initial-cluster").split(","))
    labels = dict(spec["selector"]["matchLabels"])
    labels.pop("app.kubernetes.io/component", None)
    return EtcdSet(
        name=meta["name"],
        namespace=meta["namespace"],
        image=etcd["image"],
        helper_image=helper_image,
        data_dir=_flag(args, "data-dir"),
        data_mount=mount["mountPath"],
        claim_prefix=claim["metadata"]["name"],
        claim_spec=claim["spec"],
        cluster_token=_flag(args, "initial-cluster-token"),
        peer_url_template=_flag(args, "initial-advertise-peer-urls"),
        members=members,
        pod_security=pod.get("securityContext", {}),
        container_security=etcd.get("securityContext", {}),
        labels=labels,
    )


def member_claim(etcd: EtcdSet, index: int) -> str:
    """The PVC the StatefulSet gives member ``index`` (``<template>-<statefulset>-<i>``)."""
    return f"{etcd.claim_prefix}-{etcd.name}-{index}"


def lost_claims(
    etcd: EtcdSet, found: Mapping[str, bool], members: int | None = None, only: int | None = None
) -> tuple[list[str], list[str]]:
    """The PVCs of the StatefulSet's members that a restore (``members``, ``only`` as for
    :func:`restore_manifests`) mounts and that are gone, and those being deleted, from
    ``found`` (the namespace's PVCs: name → being deleted). A restore Pod waits forever for
    either."""
    size = min(members or etcd.members, etcd.members)
    names = [member_claim(etcd, i) for i in range(size) if only is None or i == only]
    return [n for n in names if n not in found], [n for n in names if found.get(n)]


def restore_manifests(
    etcd: EtcdSet,
    snapshot: str,
    backup_volume: dict[str, Any],
    bump: int,
    stamp: str,
    members: int | None = None,
    only: int | None = None,
    create_claims: Collection[str] = (),
) -> list[dict[str, Any]]:
    """PVCs for members the StatefulSet never had (``members`` above its size) and those named
    in ``create_claims`` (lost with etcd), then one Pod per member (``only``: that member
    alone). A created PVC is shaped like the StatefulSet's volumeClaimTemplate: a new, empty
    volume, which the StatefulSet then uses as its own."""
    if not re.fullmatch(r"[0-9A-Za-z]+", stamp):
        raise ValueError("stamp must be alphanumeric")
    if "/" in snapshot or snapshot in ("", ".", ".."):
        raise ValueError("--snapshot is a file name in the backup volume, not a path")
    size = members or etcd.members
    if size not in (1, 3, 5, 7):
        raise ValueError("an etcd cluster has 1, 3, 5 or 7 members")
    if only is not None and not 0 <= only < size:
        raise ValueError(f"--member must be between 0 and {size - 1}")
    names = [f"{etcd.name}-{i}" for i in range(size)]
    all_members = [
        plan.Member(n, etcd.peer_url_template.replace("$(POD_NAME)", n), "") for n in names
    ]
    docs: list[dict[str, Any]] = []
    for i, member in enumerate(all_members):
        if only is not None and i != only:
            continue
        claim = f"{etcd.claim_prefix}-{member.name}"
        if i >= etcd.members or claim in create_claims:
            docs.append(_claim(etcd, claim))
        docs.append(_pod(etcd, member, all_members, claim, snapshot, backup_volume, bump, stamp))
    return docs


def _claim(etcd: EtcdSet, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": etcd.namespace,
            "labels": {**etcd.labels, "app.kubernetes.io/component": "etcd"},
        },
        "spec": copy.deepcopy(etcd.claim_spec),
    }


def _pod(
    etcd: EtcdSet,
    member: plan.Member,
    members: list[plan.Member],
    claim: str,
    snapshot: str,
    backup_volume: dict[str, Any],
    bump: int,
    stamp: str,
) -> dict[str, Any]:
    target = plan.Member(member.name, member.peer_url, etcd.data_dir)
    argv = plan.restore_argv(
        "/usr/local/bin/etcdutl", f"/backup/{snapshot}", target, members, etcd.cluster_token, bump
    )
    aside = shlex.quote(f"{etcd.data_dir}.before-restore-{stamp}")
    data = shlex.quote(etcd.data_dir)
    set_aside = f"if [ -e {data} ]; then mv {data} {aside}; fi"
    security = copy.deepcopy(etcd.container_security)
    mounts = [
        {"name": "data", "mountPath": etcd.data_mount},
        {"name": "backup", "mountPath": "/backup", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{member.name}-restore-{stamp.lower()}",
            "namespace": etcd.namespace,
            "labels": {**etcd.labels, LABEL: stamp.lower()},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": copy.deepcopy(etcd.pod_security),
            "initContainers": [
                {
                    "name": "set-aside",
                    "image": etcd.helper_image,
                    "command": ["/bin/sh", "-c", set_aside],
                    "securityContext": security,
                    "volumeMounts": mounts,
                }
            ],
            "containers": [
                {
                    "name": "restore",
                    "image": etcd.image,
                    "command": argv[:1],
                    "args": argv[1:],
                    "securityContext": security,
                    "volumeMounts": mounts,
                }
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "backup", **backup_volume},
                {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
            ],
        },
    }
