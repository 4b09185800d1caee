"""Hostile AdmissionReviews on every review path: whatever reaches the webhook, each path
answers a Verdict (a well-formed, JSON-encodable AdmissionReview with a code), never an
exception (which the server would answer with HTTP 500) and, with a healthy store, never
``unavailable`` (only a bug could make it so).

Paths: the artifact fence, a holder's release, a worker's claim, fenced objects (their main
resource, status and scale writes: the parent a scale write makes the webhook read is always a
plain object path), and the
webhook's lease table (FencedLease bodies from the watch). Every field of a valid review is
replaced in turn by a wrong type, a name with ``/`` (``lr/status`` once gave a ValueError from
the store's key builder and HTTP 500), a huge or deeply nested value. The store raises on a
name with ``/`` the way the etcd store does.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.types import FenceRead
from fencedlease.settings import Settings
from fencedlease.webhook import reviews
from fencedlease.webhook.leases import PolicyTable
from fencedlease.webhook.objects import ParentRef
from fencedlease.webhook.server import AdmissionServer, Review

from .hostile import check_reply, json_like, mutate
from .reviews import NS, admission_review, art, grant, review


class KeyCheckingStore(AsyncMemoryStore):
    """The in-memory store, refusing a name the etcd store cannot make a key of."""

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        for part in (namespace, name):
            if not part or "/" in part:
                raise ValueError(f"invalid name segment {part!r}")  # as EtcdStore._key
        return await super().grant_and_mark(namespace, name, token)


STORE = KeyCheckingStore()
TOKEN = grant(STORE, holder="pod-a")
POD_A = {
    "username": "system:serviceaccount:default:ctl",
    "extra": {
        "authentication.kubernetes.io/pod-name": ["pod-a"],
        "authentication.kubernetes.io/pod-uid": ["uid-a"],
    },
}


def _release() -> dict[str, Any]:
    spec = {
        "leaseRef": {"name": "l"},
        "leaseId": "g",
        "fencingToken": TOKEN,
        "holder": "pod-a",
        "holderUID": "uid-a",
    }
    return admission_review(
        "CREATE", "fencedreleases", name="r", object={"spec": spec}, userInfo=POD_A
    )


def _claim() -> dict[str, Any]:
    spec = {"templateRef": {"name": "l"}, "item": "x", "holder": "pod-a", "holderUID": "uid-a"}
    return admission_review(
        "CREATE", "fencedclaims", name="c", object={"spec": spec}, userInfo=POD_A
    )


def _object() -> dict[str, Any]:
    def cm(token: int, data: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "cfg",
                "namespace": NS,
                "uid": "cm-uid",
                "resourceVersion": "3",
                "labels": {"fencedlease.io/lease": "l"},
                "annotations": {"fencedlease.io/token": str(token)},
            },
            "data": {"k": data},
        }

    return admission_review(
        "UPDATE",
        "configmaps",
        group="",
        version="v1",
        kind={"group": "", "version": "v1", "kind": "ConfigMap"},
        name="cfg",
        object=cm(TOKEN, "new"),
        oldObject=cm(TOKEN, "old"),
        userInfo={"username": "admin"},
    )


def _status() -> dict[str, Any]:
    """A status write of a labelled object by the holder's Pod (decided by who writes)."""
    body = _object()
    body["request"].update(subResource="status", userInfo=POD_A)
    return body


def _scale() -> dict[str, Any]:
    """A scale write by the holder's Pod: a Scale (no labels); the webhook reads the parent."""

    def scale(replicas: int) -> dict[str, Any]:
        meta = {"name": "cfg", "namespace": NS, "uid": "d-uid", "resourceVersion": "3"}
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta,
                "spec": {"replicas": replicas}}  # fmt: skip

    return admission_review(
        "UPDATE",
        "deployments",
        group="apps",
        version="v1",
        kind={"group": "autoscaling", "version": "v1", "kind": "Scale"},
        subResource="scale",
        name="cfg",
        object=scale(3),
        oldObject=scale(1),
        userInfo=POD_A,
    )


_SEGMENT = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


async def parents(ref: ParentRef) -> dict[str, Any]:
    """A healthy API server: refuses (like a URL would mislead) any path that is not
    ``/api[s]/<group>/<version>/namespaces/<ns>/<resource>/<name>`` of plain segments."""
    parts = ref.path.split("/")
    if parts[1] not in ("api", "apis") or not all(_SEGMENT.fullmatch(p) for p in parts[2:]):
        raise ValueError(f"not a path the webhook may read: {ref.path!r}")
    if len(parts) != (8 if parts[1] == "apis" else 7):
        raise ValueError(f"not an object path: {ref.path!r}")
    meta = {"name": ref.name, "namespace": ref.namespace, "labels": {"fencedlease.io/lease": "l"},
            "annotations": {"fencedlease.io/token": str(TOKEN)}}  # fmt: skip
    return {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta}


BASES: dict[str, dict[str, Any]] = {
    "artifact": review("UPDATE", art(TOKEN, "new", rv="3"), art(TOKEN, "old", rv="3")),
    "release": _release(),
    "claim": _claim(),
    "object": _object(),
    "status": _status(),
    "scale": _scale(),
}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and list index of ``node``, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield (*prefix, index)
            yield from paths(value, (*prefix, index))


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


NAMES = st.sampled_from(
    [
        "lr/status",
        "a/../../../api/v1/namespaces/x/configmaps/victim",
        "..",
        "/",
        "",
        " ",
        "A_B",
        "x" * 300,
        "\x00",
        "\ud800",
        "l#frag",
        "l?x=1",
        "%2F",
    ]
)
NUMBERS = st.sampled_from([0, -1, 2**63, 2**64 + 1, 10**400, 1.5, float("inf"), True])
HOSTILE = (
    NAMES
    | NUMBERS
    | json_like
    | st.integers(0, 60).map(nested)
    | st.just("x" * 200_000)
    | st.just(list(range(10_000)))
)


def handlers() -> dict[str, Review]:
    """Each kind's own path on the server (``/fence``, ``/fence-release``, ...)."""
    settings = Settings(webhook_cert_dir=Path(tempfile.gettempdir()), allowed_writers=["admin"])
    server = AdmissionServer(settings, STORE, lambda namespace, name: "AllowEqual", parents=parents)
    return {
        "artifact": server.review_artifact,
        "release": server.review_release,
        "claim": server.review_claim,
        "object": server.review_object,
        "status": server.review_object,
        "scale": server.review_object,
    }


CASES = [(kind, path) for kind, base in BASES.items() for path in paths(base)]


@pytest.mark.parametrize(
    ("kind", "path"), CASES, ids=[f"{k}:{'.'.join(map(str, p))}" for k, p in CASES]
)
def test_every_field_of_every_path_answers_a_verdict(kind: str, path: tuple[Any, ...]) -> None:
    """Each field, in turn, replaced by each fixed hostile value."""
    review = handlers()[kind]

    async def run() -> None:
        values: tuple[Any, ...] = (
            "lr/status",
            "a/../../x",
            None,
            [],
            {},
            -1,
            2**64,
            1.5,
            True,
            "x" * 100_000,
            nested(50),
        )
        for value in values:
            body = mutate(BASES[kind], path, value)
            if reviews.too_deep(body):
                continue  # the server answers 400 before any path sees it
            check_reply(await review(body))

    asyncio.run(run())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), HOSTILE)
def test_random_hostile_fields_answer_a_verdict(
    case: tuple[str, tuple[Any, ...]], value: Any
) -> None:
    kind, path = case
    body = mutate(BASES[kind], path, value)
    if reviews.too_deep(body):
        return
    check_reply(asyncio.run(handlers()[kind](body)))


def test_a_release_naming_a_subresource_path_is_invalid_not_an_error() -> None:
    """The reported defect: ``leaseRef: lr/status`` gave a ValueError and HTTP 500."""
    body = mutate(BASES["release"], ("request", "object", "spec", "leaseRef", "name"), "lr/status")
    reply = asyncio.run(handlers()["release"](body))
    assert reply["response"]["allowed"] is False
    assert reply["response"]["status"]["message"].startswith("invalid: spec.leaseRef.name")


LEASE = {
    "apiVersion": "fencedlease.io/v1alpha1",
    "kind": "FencedLease",
    "metadata": {"name": "l", "namespace": NS, "resourceVersion": "1"},
    "spec": {"fencingPolicy": "AllowEqual", "leaseDurationSeconds": 10},
}


@pytest.mark.parametrize("path", list(paths(LEASE)), ids=lambda p: ".".join(map(str, p)))
def test_the_lease_table_takes_any_lease_body(path: tuple[Any, ...]) -> None:
    """The webhook's FencedLease table (watch events): a hostile body never raises."""
    values: tuple[Any, ...] = ("lr/status", None, [], {}, -1, 2**64, "x" * 100_000, nested(50))
    for value in values:
        table = PolicyTable()
        body = mutate(LEASE, path, value)
        for kind in (None, "ADDED", "MODIFIED", "DELETED", "BOOKMARK", 5):
            table.apply(kind, body)  # type: ignore[arg-type]
        table.listed({(NS, "l")})
        for key in list(table.policies):
            table.get(key)


@pytest.mark.parametrize("kind", sorted(BASES))
def test_each_path_reviews_its_own_kind_only(kind: str) -> None:
    """Routed by path: a review of another kind on a path is ``invalid``, never answered as
    that path's kind (the fenced objects' path takes any declared kind: not checked here)."""
    for other in ("artifact", "release", "claim"):
        if other == kind or kind in ("object", "status", "scale"):
            continue
        reply = asyncio.run(handlers()[kind](BASES[other]))
        assert reply["response"]["allowed"] is False
        assert reply["response"]["status"]["message"].startswith("invalid: this "), reply


def test_the_old_single_path_still_answers_all_three_until_0_3() -> None:
    settings = Settings(webhook_cert_dir=Path(tempfile.gettempdir()), allowed_writers=["admin"])
    server = AdmissionServer(settings, STORE, lambda namespace, name: "AllowEqual")
    for kind in ("artifact", "release", "claim"):
        legacy = asyncio.run(server.review_any_of_three(BASES[kind]))
        routed = asyncio.run(handlers()[kind](BASES[kind]))
        assert legacy["response"] == routed["response"], kind
