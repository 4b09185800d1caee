"""FencePolicies → the fence webhook's object rules (docs/fenced-objects.md).

Pure part: each valid FencePolicy becomes one webhook entry ``<policy>.objects.fencedlease.io``
in the fence's MutatingWebhookConfiguration, calling ``/fence-object`` where the fence webhook
calls ``/fence``: its kinds' CREATE, UPDATE and DELETE (main resource only), only for objects
labelled ``fencedlease.io/lease`` (``objectSelector``: unlabelled objects never reach the
webhook), in the policy's namespaces (and the operator's, when it serves one),
``failurePolicy: Fail``; and one more entry ``<policy>.scale.fencedlease.io`` for the kinds'
``scale`` subresource, without ``objectSelector`` (a Scale carries no labels: the webhook reads
the parent object, webhook/objects.py) but with a match condition sending only Pod-bound
writers (:data:`POD_BOUND`), in the same namespaces.

I/O part: :class:`PolicyWatch` lists and watches FencePolicies and, once the configuration
was written, reports on each one (``status.conditions[Ready]``, ``observedGeneration``).
Local mode registers them (:mod:`.selfregistration`), chart mode's guard adds them to the
chart's configuration (:mod:`.guard`); either writes only what the policies ask. The same
watch tells the controller's fenced-object watches which kinds are declared (the composition
root wires :meth:`PolicyWatch.follow`): one FencePolicy watch per process.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from kubernetes_asyncio import client

from fencedlease.authority import fencepolicy
from fencedlease.authority.fencepolicy import Declared
from fencedlease.kube import GONE, request_json, unless
from fencedlease.models import (
    FENCE_POLICIES,
    GROUP,
    OBJECT_LEASE_LABEL,
    VERSION,
    Condition,
    FencePolicyStatus,
    rfc3339,
)
from fencedlease.watching import ListWatch, Watched

log = logging.getLogger(__name__)

OBJECT_WEBHOOK_SUFFIX = ".objects.fencedlease.io"
SCALE_WEBHOOK_SUFFIX = ".scale.fencedlease.io"
"""A policy's scale entry (never equal to another policy's object entry: the label before
``fencedlease.io`` differs)."""
OBJECT_PATH = "/fence-object"
FENCE_PATH = "/fence"
NAME_LABEL = "kubernetes.io/metadata.name"
POLICIES_PATH = f"/apis/{GROUP}/{VERSION}/{FENCE_POLICIES}"

Policies = Mapping[str, Declared | str]


def object_client_config(fence_client_config: Mapping[str, Any]) -> dict[str, Any]:
    """Where the object webhook calls: the fence webhook's target, path ``/fence-object``."""
    out = copy.deepcopy(dict(fence_client_config))
    if isinstance(out.get("service"), dict):
        out["service"]["path"] = OBJECT_PATH
    elif isinstance(out.get("url"), str):
        parts = urlsplit(out["url"])
        out["url"] = urlunsplit(parts._replace(path=OBJECT_PATH))
    return out


def namespace_selector(declared: Declared, served: str | None) -> dict[str, Any]:
    """The policy's selector, narrowed to the operator's namespace when it serves one."""
    selector = copy.deepcopy(declared.namespace_selector)
    if served:
        expressions = list(selector.get("matchExpressions") or [])
        expressions.append({"key": NAME_LABEL, "operator": "In", "values": [served]})
        selector["matchExpressions"] = expressions
    return selector


def object_webhook(
    declared: Declared, client_config: Mapping[str, Any], timeout: int, served: str | None
) -> dict[str, Any]:
    """The webhook entry of one policy (pure)."""
    by_group: dict[str, list[str]] = {}
    for group, resource in declared.resources:
        by_group.setdefault(group, []).append(resource)
    return {
        "name": f"{declared.name}{OBJECT_WEBHOOK_SUFFIX}",
        "admissionReviewVersions": ["v1"],
        "clientConfig": object_client_config(client_config),
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                # status: decided by who writes it (webhook/objects.py); scale has its own
                # entry (scale_webhook): a Scale carries no labels, this selector never matches
                "resources": sorted([*resources, *(f"{r}/status" for r in resources)]),
                "scope": "Namespaced",
            }
            for group, resources in sorted(by_group.items())
        ],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "NoneOnDryRun",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": timeout,
        "namespaceSelector": namespace_selector(declared, served),
        "objectSelector": {"matchExpressions": [{"key": OBJECT_LEASE_LABEL, "operator": "Exists"}]},
    }


POD_BOUND = {
    "name": "pod-bound-writers",
    "expression": (
        "has(request.userInfo.extra) && "
        "'authentication.kubernetes.io/pod-name' in request.userInfo.extra"
    ),
}
"""The scale entry's one match condition: only a writer with a Pod-bound identity is sent.
Every other writer (the HPA, the cluster's controllers, people) is admitted by the webhook
without a look (webhook/objects.py), so skipping the call decides the same, costs nothing and
keeps them scaling while the fence is down."""


def scale_webhook(
    declared: Declared, client_config: Mapping[str, Any], timeout: int, served: str | None
) -> dict[str, Any]:
    """The ``scale`` entry of one policy (pure): :func:`object_webhook`'s target, namespaces
    and failure policy, the kinds' ``<resource>/scale`` UPDATEs, no ``objectSelector`` (a
    Scale has no labels; the webhook reads the parent and admits an unlabelled one), and
    :data:`POD_BOUND` as its match condition."""
    entry = object_webhook(declared, client_config, timeout, served)
    entry["name"] = f"{declared.name}{SCALE_WEBHOOK_SUFFIX}"
    for rule in entry["rules"]:
        kinds = [r for r in rule["resources"] if "/" not in r]
        rule["operations"] = ["UPDATE"]
        rule["resources"] = sorted(f"{r}/scale" for r in kinds)
    entry["objectSelector"] = {}
    entry["matchConditions"] = [dict(POD_BOUND)]
    return entry


def object_webhooks(
    policies: Policies, client_config: Mapping[str, Any], timeout: int, served: str | None
) -> list[dict[str, Any]]:
    """Two entries per valid policy (objects, then scale), by name (pure)."""
    return [
        make(found, client_config, timeout, served)
        for _, found in sorted(policies.items())
        if isinstance(found, Declared)
        for make in (object_webhook, scale_webhook)
    ]


def is_object_webhook(webhook: Any) -> bool:
    """An entry of a FencePolicy (its objects' or its scale entry)."""
    return isinstance(webhook, dict) and is_policy_entry(str(webhook.get("name", "")))


def is_policy_entry(name: str) -> bool:
    return name.endswith((OBJECT_WEBHOOK_SUFFIX, SCALE_WEBHOOK_SUFFIX))


def policy_of_entry(name: str) -> str:
    """The FencePolicy an entry name belongs to (pure)."""
    for suffix in (OBJECT_WEBHOOK_SUFFIX, SCALE_WEBHOOK_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def with_object_webhooks(
    configuration: Mapping[str, Any], webhooks: list[dict[str, Any]]
) -> dict[str, Any]:
    """``configuration`` whose object webhooks are exactly ``webhooks`` (the caBundle of the
    fence webhook carried over when the entry has none). Pure."""
    out = copy.deepcopy(dict(configuration))
    kept = [w for w in out.get("webhooks") or [] if not is_object_webhook(w)]
    bundle = next(
        (
            (w.get("clientConfig") or {}).get("caBundle")
            for w in kept
            if isinstance(w, dict) and w.get("name") == "fence.fencedlease.io"
        ),
        None,
    )
    added = copy.deepcopy(webhooks)
    for webhook in added:
        if bundle and not webhook["clientConfig"].get("caBundle"):
            webhook["clientConfig"]["caBundle"] = bundle
    out["webhooks"] = kept + added
    return out


def _changed_fields(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The fields we set in ``wanted`` that ``have`` stores otherwise (a default the API server
    adds does not count; ``caBundle`` is the CA's to rotate), and ``matchConditions`` if it has
    any we did not set (any would let writes skip the entry). Pure."""
    changed = [key for key, value in wanted.items() if not _same_field(key, have.get(key), value)]
    if have.get("matchConditions") and "matchConditions" not in wanted:
        changed.append("matchConditions")
    return changed


def _same_field(key: str, got: Any, value: Any) -> bool:
    if key == "clientConfig":
        got = {k: v for k, v in (got or {}).items() if k != "caBundle"}
        value = {k: v for k, v in value.items() if k != "caBundle"}
        if isinstance(got.get("service"), dict):
            got["service"] = {**got["service"]}
            if isinstance(value.get("service"), dict):
                got["service"].setdefault("port", value["service"].get("port", 443))
                value = {**value, "service": {"port": 443, **value["service"]}}
    return bool(got == value)


def _live_objects(configuration: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {
        w["name"]: w for w in (configuration or {}).get("webhooks") or [] if is_object_webhook(w)
    }


def objects_differ(configuration: Mapping[str, Any] | None, webhooks: list[dict[str, Any]]) -> bool:
    """Whether the configuration's object webhooks are not what ``webhooks`` ask (each field
    we set compared as stored; a default the API server adds does not count). Pure."""
    live = _live_objects(configuration)
    if set(live) != {w["name"] for w in webhooks}:
        return True
    return any(_changed_fields(live[wanted["name"]], wanted) for wanted in webhooks)


FIXED_FIELDS = frozenset(
    {
        "admissionReviewVersions",
        "failurePolicy",
        "matchPolicy",
        "sideEffects",
        "reinvocationPolicy",
        "objectSelector",
        "matchConditions",
    }
)
"""The fields of an object webhook that no FencePolicy, Helm value or CA rotation changes: a
difference there was made by someone else, whatever the guard saw before."""


def altered(
    configuration: Mapping[str, Any] | None,
    webhooks: list[dict[str, Any]],
    before: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """The object webhooks someone else changed, by name, with what (pure). ``webhooks``: what
    the policies ask now; ``before``: what they asked when the configuration last matched, by
    name. An entry is altered when a field in :data:`FIXED_FIELDS` differs, or when it is
    missing or differs while its policy asks the same as then (its rules, selector, target or
    timeout did not move: nobody but the guard writes them). A difference that follows a
    policy, a Helm value or the CA changing is not an alteration: it is followed, not alerted."""
    live = _live_objects(configuration)
    found: dict[str, str] = {}
    for wanted in webhooks:
        name = wanted["name"]
        asked_before = before.get(name) == wanted
        have = live.get(name)
        if have is None:
            if asked_before:
                found[name] = "removed"
            continue
        changed = _changed_fields(have, wanted)
        shown = [f for f in changed if asked_before or f in FIXED_FIELDS]
        if shown:
            found[name] = ", ".join(f"{f} changed" for f in sorted(shown))
    return found


def ready_condition(
    found: Declared | str,
    problem: str | None,
    previous: Mapping[str, Any],
    now: dt.datetime,
    unserved: str | None = None,
) -> FencePolicyStatus:
    """The status to report for one policy (pure): ``Ready`` with the generation it describes;
    ``lastTransitionTime`` moves only when ``status`` changes. ``unserved``: why a declared
    kind is not served by the API server (its entry is registered all the same)."""
    generation = previous.get("generation") if isinstance(previous, Mapping) else None
    state: Literal["True", "False"]
    if isinstance(found, str):
        state, reason, message = "False", "Refused", found
    elif problem is not None:
        state, reason, message = "False", "NotRegistered", problem
    elif unserved is not None:
        state, reason, message = "False", "KindNotServed", unserved
    else:
        kinds = ", ".join(f"{r}.{g}" if g else r for g, r in found.resources)
        state, reason = "True", "Registered"
        message = f"writes of labelled {kinds} are fenced"
    old = (previous.get("status") or {}).get("conditions") or []
    before = next((c for c in old if isinstance(c, dict) and c.get("type") == "Ready"), None)
    since = rfc3339(now)
    if before is not None and before.get("status") == state and before.get("lastTransitionTime"):
        since = str(before["lastTransitionTime"])
    condition = Condition(
        type="Ready",
        status=state,
        reason=reason,
        message=message[:1024],
        last_transition_time=since,
        observed_generation=generation if isinstance(generation, int) else None,
    )
    return FencePolicyStatus(
        observed_generation=generation if isinstance(generation, int) else None,
        conditions=[condition],
    )


def _same(status: FencePolicyStatus, stored: Any) -> bool:
    if not isinstance(stored, dict):
        return False
    mine = status.to_patch()
    return bool(stored.get("observedGeneration") == mine.get("observedGeneration")) and [
        {k: c.get(k) for k in ("type", "status", "reason", "message")}
        for c in stored.get("conditions") or []
        if isinstance(c, dict)
    ] == [
        {k: c.get(k) for k in ("type", "status", "reason", "message")}
        for c in mine.get("conditions") or []
    ]


Scope = Literal["Namespaced", "Cluster", "Unserved"]


def scope_refusal(pair: tuple[str, str], scope: Scope | None) -> str | None:
    """Why a declared kind cannot be fenced, by what discovery says of it (pure)."""
    if scope != "Cluster":
        return None
    return (
        f"{_kind(pair)} is cluster-scoped: only namespaced kinds can be fenced (an object's "
        "lease is a FencedLease in its namespace, and the webhook's rules match namespaced "
        "objects only), so its writes would not be fenced"
    )


def unserved_note(pairs: list[tuple[str, str]]) -> str | None:
    """The Ready message of a policy whose kinds the API server does not serve (pure)."""
    if not pairs:
        return None
    kinds = ", ".join(_kind(p) for p in pairs)
    return (
        f"the API server serves no resource {kinds} (a typo, or a CRD not installed yet): its "
        "rule is registered, so its writes are fenced as soon as it is served (checked again "
        "at every resync)"
    )


def _kind(pair: tuple[str, str]) -> str:
    group, resource = pair
    return f"{resource}.{group}" if group else resource


Follower = Callable[[Policies], None]
"""Told what every policy declares (or why it is refused) whenever that may have changed."""


class PolicyWatch:
    """The FencePolicies as the API server stores them, and their status reports: the one
    FencePolicy watch of a process, feeding the configuration (``on_change``: local mode's
    registration or chart mode's guard) and the declared kinds' watches (:meth:`follow`).

    Besides what :func:`fencepolicy.parse` refuses, a policy is refused when discovery says
    one of its kinds is cluster-scoped (:meth:`discover`), and when the API server refused its
    webhook entry (:meth:`reject`, until the policy changes). A refused policy declares
    nothing: its entry is not registered and its kinds are not followed."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        on_change: Callable[[], Awaitable[None]] | None = None,
        may_write: Callable[[], bool] = lambda: True,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api = api
        self.on_change = on_change
        self.may_write = may_write
        self.wall = wall
        self.bodies: dict[str, dict[str, Any]] = {}
        self.synced = False
        self.scopes: dict[tuple[str, str], Scope] = {}
        """What discovery said of each declared kind (``Unserved`` is asked again)."""
        self.rejected: dict[str, tuple[Any, str]] = {}
        """Policies whose webhook entry the API server refused: the spec it refused, why."""
        self.followers: list[Follower] = []

    def follow(self, follower: Follower) -> None:
        """Tell ``follower`` :attr:`policies` once listed and whenever they may change."""
        self.followers.append(follower)
        if self.synced:
            follower(self.policies)

    def _tell(self) -> None:
        if self.synced and self.followers:
            policies = self.policies
            for follower in self.followers:
                follower(policies)

    @property
    def policies(self) -> dict[str, Declared | str]:
        return {name: self.judged(name, body) for name, body in self.bodies.items()}

    def judged(self, name: str, body: Mapping[str, Any]) -> Declared | str:
        """What a stored policy declares, or why it is refused (parse, scope, API server)."""
        found = fencepolicy.parse(body)
        if not isinstance(found, Declared):
            return found
        rejected = self.rejected.get(name)
        if rejected is not None and rejected[0] == _generation(body):
            return f"the API server refused its webhook entry: {rejected[1]}"
        for pair in found.resources:
            why = scope_refusal(pair, self.scopes.get(pair))
            if why is not None:
                return why
        return found

    def reject(self, name: str, reason: str) -> None:
        """The API server refused policy ``name``'s webhook entry: refuse the policy (Refused,
        with ``reason``) until its spec changes."""
        body = self.bodies.get(name)
        if body is not None:
            self.rejected[name] = (_generation(body), reason)
            log.warning("FencePolicy %s refused by the API server: %s", name, reason)
            self._tell()

    def unserved(self, found: Declared | str) -> str | None:
        if not isinstance(found, Declared):
            return None
        return unserved_note([p for p in found.resources if self.scopes.get(p) == "Unserved"])

    async def discover(self) -> bool:
        """Ask discovery the scope of each declared kind not known yet (or not served last
        time); ``True`` when an answer changed. An API error leaves the kind unknown (not
        refused: asked again next time)."""
        pairs = {
            pair
            for body in self.bodies.values()
            if isinstance(found := fencepolicy.parse(body), Declared)
            for pair in found.resources
        }
        changed = False
        for pair in sorted(pairs):
            if self.scopes.get(pair) in ("Namespaced", "Cluster"):
                continue
            try:
                scope = await resource_scope(self.api, *pair)
            except Exception as error:
                log.warning("discovery of %s failed (asked again later): %s", _kind(pair), error)
                continue
            if self.scopes.get(pair) != scope:
                self.scopes[pair] = scope
                changed = True
        if changed:
            self._tell()
        return changed

    async def run(self) -> None:
        what = Watched(GROUP, VERSION, FENCE_POLICIES)
        await ListWatch(self.api, what, self._changed, on_listed=self._listed).run()

    async def _listed(self, _: str | None, listed: set[tuple[str, str]]) -> None:
        self.bodies = {n: b for n, b in self.bodies.items() if ("", n) in listed}
        self.rejected = {n: r for n, r in self.rejected.items() if n in self.bodies}
        self.scopes = {}  # a relist asks discovery again (a CRD may have been replaced)
        self.synced = True
        await self._notify()

    async def _changed(self, event: Mapping[str, Any]) -> None:
        kind, obj = event["type"], event["object"]
        name = str((obj.get("metadata") or {}).get("name"))
        before = self.bodies.get(name)
        if kind == "DELETED":
            self.bodies.pop(name, None)
            self.rejected.pop(name, None)
        else:
            self.bodies[name] = _lean(obj)
        after = self.bodies.get(name)
        if kind is None:  # listed: notified once the list is complete
            return
        if before is None or after is None or _generation(before) != _generation(after):
            await self._notify()

    async def _notify(self) -> None:
        await self.discover()
        try:
            if self.on_change is not None:
                await self.on_change()  # may refuse policies the API server refused
        finally:
            self._tell()

    async def report(self, problem: str | None) -> None:
        """Write each policy's status (leader only; only what changed)."""
        if not self.may_write():
            return
        for name, body in list(self.bodies.items()):
            found = self.judged(name, body)
            status = ready_condition(found, problem, body, self.wall(), self.unserved(found))
            if _same(status, body.get("status")):
                continue
            patch: Any = {"status": status.to_patch()}
            await unless(
                GONE,
                request_json(
                    self.api,
                    "PATCH",
                    f"{POLICIES_PATH}/{name}/status",
                    patch,
                    content_type="application/merge-patch+json",
                ),
            )
            body["status"] = patch["status"]


async def resource_scope(api: client.ApiClient, group: str, resource: str) -> Scope:
    """``Namespaced`` or ``Cluster`` as discovery lists ``resource`` of ``group`` (in any
    version the group serves), ``Unserved`` when it lists none. Raises on API errors."""
    if group:
        found = await unless(GONE, request_json(api, "GET", f"/apis/{group}"))
        versions = [
            v["groupVersion"]
            for v in (found or {}).get("versions") or []
            if isinstance(v, dict) and isinstance(v.get("groupVersion"), str)
        ]
        paths = [f"/apis/{gv}" for gv in versions]
    else:
        paths = ["/api/v1"]
    for path in paths:
        listing = await unless(GONE, request_json(api, "GET", path))
        for entry in (listing or {}).get("resources") or []:
            if isinstance(entry, dict) and entry.get("name") == resource:
                return "Namespaced" if entry.get("namespaced") else "Cluster"
    return "Unserved"


def _generation(body: Mapping[str, Any]) -> Any:
    return (body.get("spec"), body.get("generation"))


def _lean(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "generation": meta.get("generation")},
        "generation": meta.get("generation"),
        "spec": obj.get("spec"),
        "status": obj.get("status"),
    }
