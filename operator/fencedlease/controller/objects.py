"""Record committed writes of fenced objects: their lease's high-water mark follows them.

The object webhook (docs/fenced-objects.md) decides on a write before the API server commits
it, and changes no fencing state. Like :mod:`.artifacts` for FencedArtifacts, this watches what
was really stored — every kind a FencePolicy declares, only objects labelled
``fencedlease.io/lease`` (the label selector is applied by the API server) — and advances the
lease's mark in etcd to each stored token (only a token issued for that lease moves it;
anything else is evented ``UnverifiedToken`` on the object, once per object and token).

A DELETE is admitted only once the mark covers the stored token, so a deleted object needs no
finalizer: its last token is recorded from the watch before the delete can pass.

Only a **fenced** object moves a mark: one of a kind some FencePolicy declares, in a namespace
that policy's ``namespaceSelector`` selects (:meth:`DeclaredKinds.fenced`). A labelled copy
elsewhere (an unselected namespace, or a kind only another policy declares for other
namespaces) was never checked by the webhook, so its token is not a commit: it is ignored.

Recording is a controller write: only the leader records (a standby keeps what it saw and
records it when it starts leading).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from fencedlease import metrics
from fencedlease.authority import fencepolicy
from fencedlease.authority.fencepolicy import Declared
from fencedlease.authority.types import LeaseKey, StoreUnavailable
from fencedlease.controller.leadership import Leadership
from fencedlease.controller.ports import CommitStore, EventWrites
from fencedlease.events import ObjectRef
from fencedlease.kube import preferred_version
from fencedlease.models import OBJECT_LEASE_LABEL, LabelSelector
from fencedlease.watching import ListWatch, Watched

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
_TOKEN = re.compile(r"[1-9][0-9]{0,18}")
Kind = tuple[str, str]
"""``(apiGroup, resource)``."""


@dataclass(frozen=True, slots=True)
class Commit:
    """One stored state of a fenced object: its lease, token and what to event about."""

    domain: LeaseKey
    token: int
    ref: ObjectRef

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Commit | None:
        """The commit a stored object shows (``None``: unlabelled, or no valid token)."""
        meta = obj.get("metadata") or {}
        lease = (meta.get("labels") or {}).get(OBJECT_LEASE_LABEL)
        raw = (meta.get("annotations") or {}).get("fencedlease.io/token")
        if not isinstance(lease, str) or not isinstance(raw, str) or not _TOKEN.fullmatch(raw):
            return None  # what the webhook calls invalid ("²" is a digit to isdigit())
        token = int(raw)
        if not 1 <= token <= 2**63 - 1:
            return None
        namespace = str(meta.get("namespace") or "")
        ref = ObjectRef(
            str(obj.get("kind") or "object"),
            str(obj.get("apiVersion") or ""),
            namespace,
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
        )
        return cls(LeaseKey(namespace, lease), token, ref)


class ObjectCommits:
    """The highest stored token per lease, recorded in etcd by the leader."""

    def __init__(self, store: CommitStore, kube: EventWrites, leadership: Leadership) -> None:
        self.store = store
        self.kube = kube
        self.leadership = leadership
        self.pending: dict[LeaseKey, Commit] = {}
        self.recorded: dict[LeaseKey, int] = {}
        self._reported: set[tuple[str, int]] = set()
        self.wake = asyncio.Event()

    def observe(self, obj: Mapping[str, Any]) -> None:
        """A stored state from the watch (sync: the watch never waits for etcd)."""
        commit = Commit.from_object(obj)
        if commit is None:
            return
        if commit.token <= max(
            self.recorded.get(commit.domain, 0),
            getattr(self.pending.get(commit.domain), "token", 0),
        ):
            return
        self.pending[commit.domain] = commit
        self.wake.set()

    def leadership_started(self) -> None:
        self.wake.set()

    async def record_pending(self) -> float | None:
        """Record every pending commit (leader only); a retry delay when etcd failed."""
        if not self.leadership.is_leader():
            return None
        for domain, commit in list(self.pending.items()):
            try:
                mark = await self.store.record_commit(domain.namespace, domain.name, commit.token)
            except StoreUnavailable as error:
                log.warning("%s: cannot record token %d yet: %s", domain, commit.token, error)
                return RETRY_SECONDS
            if self.pending.get(domain) is commit:
                del self.pending[domain]
            self.recorded[domain] = max(self.recorded.get(domain, 0), commit.token)
            if not mark.verified and not mark.retired:
                await self._report_unverified(commit)
        return None

    async def run(self) -> None:
        """Forever: record what the watches saw."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            delay = await self.record_pending()
            if delay is not None:
                await asyncio.sleep(delay)
                self.wake.set()

    async def _report_unverified(self, commit: Commit) -> None:
        key = (commit.ref.uid, commit.token)
        if key in self._reported:
            return
        self._reported.add(key)
        metrics.UNVERIFIED_TOKENS.labels("object").inc()
        await self.kube.event(
            commit.ref,
            "Warning",
            "UnverifiedToken",
            f"annotation fencedlease.io/token {commit.token} was not issued for lease "
            f"{commit.domain}: it was written past the fence (webhook bypassed?), so it does "
            "not move the lease's high-water mark",
        )


Watcher = Callable[[Kind], Awaitable[None]]


class DeclaredKinds:
    """Keeps one label-scoped watch per kind the FencePolicies declare, feeding
    :class:`ObjectCommits`. The policies are told (:meth:`declare`) by the process's one
    FencePolicy watch (the composition root wires it); a refused policy declares nothing."""

    def __init__(
        self, api: client.ApiClient, commits: ObjectCommits, namespace: str | None = None
    ) -> None:
        self.api = api
        self.commits = commits
        self.namespace = namespace
        self.policies: Mapping[str, Declared | str] = {}
        self.watches: dict[Kind, asyncio.Task[None]] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        """Labels of every namespace (only the served one when serving one)."""
        field = f"metadata.name={namespace}" if namespace else None
        self._namespace_watch = ListWatch(
            api, Watched("", "v1", "namespaces", field_selector=field), self._namespace
        )

    async def run(self) -> None:
        """Watch the namespaces' labels (and, from :meth:`declare`, the declared kinds) until
        cancelled."""
        try:
            await self._namespace_watch.run()
        finally:
            for task in self.watches.values():
                task.cancel()

    def declare(self, policies: Mapping[str, Declared | str]) -> None:
        """What every FencePolicy declares now (or why it is refused): follow its kinds."""
        self.policies = dict(policies)
        self._follow()

    def _namespace(self, event: Mapping[str, Any]) -> None:
        meta = event["object"].get("metadata") or {}
        name = str(meta.get("name") or "")
        if event["type"] == "DELETED":
            self.namespaces.pop(name, None)
        else:
            self.namespaces[name] = dict(meta.get("labels") or {})

    def fenced(self, kind: Kind, namespace: str, labels: Mapping[str, str]) -> bool:
        """Is an object of ``kind`` in ``namespace`` (labelled ``labels``) fenced: does a
        valid policy declaring the kind select the namespace? (pure)"""
        if self.namespace and namespace != self.namespace:
            return False
        for declared in self.policies.values():
            if isinstance(declared, str) or kind not in declared.resources:
                continue
            try:
                selector = LabelSelector.model_validate(declared.namespace_selector)
            except ValueError:
                continue  # a selector the API server would refuse selects nothing
            if selector.matches(labels):
                return True
        return False

    async def _labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels: from the watch, else read (a namespace newer than the
        watch's last event); ``None`` when it is gone or cannot be read."""
        found = self.namespaces.get(namespace)
        if found is not None:
            return found
        try:
            body = await client.CoreV1Api(self.api).read_namespace(namespace)
        except Exception:
            log.warning("cannot read namespace %s", namespace, exc_info=True)
            return None
        return dict(body.metadata.labels or {})

    def kinds(self) -> frozenset[Kind]:
        return fencepolicy.declared_kinds(self.policies)

    def _follow(self) -> None:
        wanted = self.kinds()
        for kind in set(self.watches) - wanted:
            self.watches.pop(kind).cancel()
        for kind in wanted - set(self.watches):
            self.watches[kind] = asyncio.create_task(
                self._watch(kind), name=f"fenced-objects-{kind[1]}.{kind[0]}"
            )

    async def _watch(self, kind: Kind) -> None:
        group, resource = kind
        while True:
            try:
                version = await preferred_version(self.api, group)
            except Exception:
                log.warning("discovery of %s failed", group or "core", exc_info=True)
                version = None
            if version is not None:
                break
            log.warning("%s.%s is not served yet; retrying", resource, group)
            await asyncio.sleep(RETRY_SECONDS)
        what = Watched(group, version, resource, self.namespace, OBJECT_LEASE_LABEL)
        await self._namespace_watch.synced.wait()

        async def changed(event: Mapping[str, Any]) -> None:
            obj = event["object"]
            namespace = str((obj.get("metadata") or {}).get("namespace") or "")
            labels = await self._labels(namespace)
            if labels is not None and self.fenced(kind, namespace, labels):
                self.commits.observe(_with_kind(obj, group, version))

        await ListWatch(self.api, what, changed).run()


def _with_kind(obj: dict[str, Any], group: str, version: str) -> dict[str, Any]:
    """List items carry no ``kind``/``apiVersion``: fill what the Event needs."""
    if "apiVersion" not in obj:
        obj = {**obj, "apiVersion": f"{group}/{version}" if group else version}
    return obj
