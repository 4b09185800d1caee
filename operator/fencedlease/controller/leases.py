"""The controller's copies of FencedLeases (from the watch) and the restore guard's floor."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.models import FencedLeaseSpec, FencedLeaseStatus, Phase, parse_spec

MAX_STATUS_ERROR = 512
"""Characters of a status's parse error kept for the Event that reports it."""

# Kept on every FencedLease by the elected controller (not by Kopf: a standby writes nothing);
# removed once a deleted lease is released and its Pod annotations are cleaned.
LEASE_FINALIZER = "fencedlease.io/finalizer"


@dataclass(frozen=True, slots=True)
class Unverified:
    """What a lease's status shows that the authority cannot vouch for: a token without a
    valid proof, or a status that does not parse at all (``error``). Either is reported and
    rewritten from etcd, never trusted."""

    token: int | None
    """The ``fencingToken`` the status shows (``None``: none, or not an integer)."""
    error: str | None = None
    """Why the status does not parse (one line), or ``None``: it parses."""


@dataclass
class LeaseObject:
    """The controller's copy of one FencedLease (from the watch)."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: FencedLeaseSpec | str  # a parsed spec, or the user-facing error
    status: FencedLeaseStatus
    """The status as parsed; empty when it does not parse (:attr:`unparsed`)."""
    annotations: dict[str, str] = field(default_factory=dict)
    deleting: bool = False
    resource_version: str = ""
    finalizers: tuple[str, ...] = ()
    unparsed: Unverified | None = None
    """Set when the status does not parse (someone else wrote it, or an older CRD let it
    in): nothing of it is trusted, and the next pass writes the status from etcd."""

    @property
    def key(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> LeaseObject:
        meta = body.get("metadata") or {}
        status, unparsed = parse_status(body.get("status"))
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            spec=parse_spec(FencedLeaseSpec, body.get("spec")),
            status=status,
            annotations=dict(meta.get("annotations") or {}),
            deleting=meta.get("deletionTimestamp") is not None,
            resource_version=str(meta.get("resourceVersion") or ""),
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
            unparsed=unparsed,
        )


def parse_status(raw: Any) -> tuple[FencedLeaseStatus, Unverified | None]:
    """A lease's status as the watch shows it: the parsed status, or an empty one and what
    makes it unparsable (its token, if it shows an integer one, and a one-line error)."""
    if raw is None:
        return FencedLeaseStatus(), None
    if not isinstance(raw, Mapping):
        return FencedLeaseStatus(), Unverified(
            None, f"status: not an object ({type(raw).__name__})"
        )
    fields = {k: v for k, v in raw.items() if k != "kopf"}
    try:
        return FencedLeaseStatus.model_validate(fields), None
    except ValidationError as exc:
        error = "; ".join(
            f"status.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        if len(error) > MAX_STATUS_ERROR:
            error = error[: MAX_STATUS_ERROR - 1] + "…"
        token = fields.get("fencingToken")
        shown = token if isinstance(token, int) and not isinstance(token, bool) else None
        return FencedLeaseStatus(), Unverified(shown, error)


class LeaseCache:
    """FencedLeases by key, and the highest *verified* token they show (restore-guard floor).

    A status token counts only when it carries the authority's proof (``tokenProof``): anyone
    allowed to patch ``fencedleases/status`` could otherwise stop every grant in the cluster
    with one huge number.  Unverified tokens above the floor are kept for reporting.
    """

    def __init__(self, proofs: TokenProofs) -> None:
        self.proofs = proofs
        self._leases: dict[LeaseKey, LeaseObject] = {}
        self._written: dict[LeaseKey, FencedLeaseStatus] = {}
        """Our last status write of a lease, until the watch shows anything of it again."""
        self._unverified: dict[LeaseKey, Unverified] = {}
        self._verified: dict[LeaseKey, int] = {}
        self.max_token = 0
        # Which leases a Pod can move, without a scan of every lease (a Pod event that
        # changes labels or readiness asks; where job Pods come and go that is often):
        self._by_label: dict[tuple[str, str, str], dict[LeaseKey, None]] = {}
        """(namespace, key, value) of a selector's first ``matchLabels`` pair -> leases."""
        self._open: dict[str, dict[LeaseKey, None]] = {}
        """namespace -> leases whose selector has no ``matchLabels`` (checked on every Pod)."""
        self._by_holder: dict[tuple[str, str], dict[LeaseKey, None]] = {}
        """(namespace, status.holder) -> leases."""

    def _places(self, lease: LeaseObject) -> list[tuple[dict[Any, dict[LeaseKey, None]], Any]]:
        """Where ``lease`` is indexed: (index, key) pairs."""
        ns = lease.namespace
        places: list[tuple[dict[Any, dict[LeaseKey, None]], Any]] = []
        if isinstance(lease.spec, FencedLeaseSpec):
            pairs = lease.spec.holder_selector.match_labels
            if pairs:
                first = min(pairs)
                places.append((self._by_label, (ns, first, pairs[first])))
            else:
                places.append((self._open, ns))
            if lease.status.holder:
                places.append((self._by_holder, (ns, lease.status.holder)))
        return places

    def _index(self, lease: LeaseObject) -> None:
        for index, at in self._places(lease):
            index.setdefault(at, {})[lease.key] = None

    def _unindex(self, lease: LeaseObject) -> None:
        for index, at in self._places(lease):
            entry = index.get(at)
            if entry is not None:
                entry.pop(lease.key, None)
                if not entry:
                    del index[at]

    def upsert(self, lease: LeaseObject) -> bool:
        """Take the watch's copy of a lease. Returns whether it shows a status another writer
        wrote: changed, and not our own last write coming back (the lease must be looked at
        again, and its status put right if need be)."""
        known = self._leases.get(lease.key)
        if known is not None:
            self._unindex(known)
        self._leases[lease.key] = lease
        self._index(lease)
        # Any event of the lease supersedes our own last write of it: it is that write coming
        # back, or something newer (another writer's), or, rarely, an older version still in
        # flight (a write decided on it is then refused as a conflict, and the next event
        # puts things right). Our write must never hide what the API shows after it.
        mine = self._written.pop(lease.key, None)
        foreign = known is not None and known.status != lease.status and lease.status != mine
        status = lease.status
        token = status.fencing_token
        if lease.unparsed is not None:
            found: Unverified | None = lease.unparsed
        elif token is None:
            found = None
        elif self.proofs.verify(
            lease.namespace, lease.name, status.lease_id, token, status.token_proof
        ):
            found = None
            self._see(lease.key, token)
        else:
            found = Unverified(token)
        if found is None:
            self._unverified.pop(lease.key, None)
        else:
            # Someone else wrote the status (ours was dropped above): the next pass starts
            # from what the API shows and puts the signed truth back.
            self._unverified[lease.key] = found
        return foreign

    def unverified(self, key: LeaseKey) -> Unverified | None:
        """What lease ``key``'s status shows that the authority cannot vouch for: a token
        without a valid proof, or a status that does not parse (``None``: neither)."""
        return self._unverified.get(key)

    def remove(self, key: LeaseKey) -> None:
        known = self._leases.pop(key, None)
        if known is not None:
            self._unindex(known)
        self._written.pop(key, None)
        self._unverified.pop(key, None)
        self._verified.pop(key, None)

    def status(self, key: LeaseKey) -> FencedLeaseStatus | None:
        """The status this process last wrote while the watch has shown nothing of the lease
        since (newer than an event still in flight); else the watch's."""
        lease = self._leases.get(key)
        return self._written.get(key) or (lease.status if lease is not None else None)

    def written(self, key: LeaseKey, status: FencedLeaseStatus) -> None:
        """We wrote ``status``. Kept only until the watch shows the lease again: a status
        someone else writes after it (a replica of an older release, a paused former leader,
        a restore of the object) must not stay hidden behind ours, or no pass would ever put
        it right (docs/design.md, "Status")."""
        self._written[key] = status
        token = status.fencing_token
        if token is not None and self.proofs.verify(
            key.namespace, key.name, status.lease_id, token, status.token_proof
        ):
            self._see(key, token)

    def _see(self, key: LeaseKey, token: int) -> None:
        self._verified[key] = max(self._verified.get(key, 0), token)
        self.see_token(token)

    def verified_token(self, key: LeaseKey) -> int:
        """The highest token lease ``key`` has shown with the authority's proof (0: none).
        A generation in etcd below it predates a grant this lease already made: etcd was
        restored from an older snapshot."""
        return self._verified.get(key, 0)

    def forget_written(self) -> None:
        """Leadership (re)starts: another replica may have written since; trust the watch."""
        self._written.clear()

    def all_keys(self) -> list[LeaseKey]:
        return list(self._leases)

    def get(self, key: LeaseKey) -> LeaseObject | None:
        return self._leases.get(key)

    def see_token(self, token: int) -> None:
        self.max_token = max(self.max_token, token)

    def touching(
        self, namespace: str, labels: Iterable[Mapping[str, str]], holder: str
    ) -> list[LeaseObject]:
        """The leases of ``namespace`` a Pod named ``holder`` that carries (or carried) one
        of the label sets ``labels`` can move: every lease whose selector matches one of them
        or whose status names the Pod, and maybe a few more (a lease is indexed by one
        ``matchLabels`` pair; :func:`~.handlers.leases_moved` decides exactly). A lookup per
        label, not a scan of every lease."""
        found: dict[LeaseKey, None] = dict(self._open.get(namespace, {}))
        for mapping in labels:
            for k, v in mapping.items():
                found.update(self._by_label.get((namespace, k, v), {}))
        found.update(self._by_holder.get((namespace, holder), {}))
        return [self._leases[key] for key in found]

    def __len__(self) -> int:
        return len(self._leases)

    def phases(self) -> dict[str, int]:
        counts = {phase.value: 0 for phase in Phase}
        for key in self._leases:
            status = self.status(key)
            if status is not None and status.phase is not None:
                counts[status.phase.value] += 1
        return counts
