"""Backup and restore of the fencing state with the real etcd, etcdutl and kube-apiserver
(docs/operations.md, "Backup and restore").

A snapshot is taken (the Maintenance.Snapshot RPC that `etcdctl snapshot save` calls) and kept
by the backup CronJob's retention step; grants and fenced writes go on; etcd is lost entirely
(process stopped, data deleted); `fencedlease etcd restore` brings back the *older* snapshot with
a revision bump it derives from the tokens the cluster shows. Then every new token compares above
the tokens already accepted, stale writers stay refused, and no grant is frozen: the history
checker of tests/chaos judges the whole sequence.

The control: the same snapshot restored without the bump reissues tokens already used (a store
without a floor) — the checker reports it — or, with the operator's floor, freezes every grant
behind the restore guard.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from fencedlease.authority.types import Acquired, StoreUnavailable
from fencedlease.cli import main
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import EtcdServer, LocalCluster
from fencedlease.store.etcd import EtcdStore
from tests.chaos.checker import check
from tests.chaos.etcd import reserved_port
from tests.chaos.history import Fault, Grant, History, WriteFail, WriteInvoke, WriteOk
from tests.fakes import FakeClock

from .fence_harness import FenceHarness, artifact, publish, start_harness, stop_harness

pytestmark = pytest.mark.timeout(240)

LEASE, ART = "report", "report-latest"
_CODE = re.compile(r"stale_fence|unknown_token|holder_mismatch|lease_mismatch|unavailable")


class Run:
    """Grants and fenced writes, recorded as a :class:`History` on one monotonic clock."""

    def __init__(self, h: FenceHarness, ns: str) -> None:
        self.h, self.ns = h, ns
        self.history = History(policies={LEASE: "AllowEqual"}, durations={LEASE: 30.0})
        self.start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.start

    async def grant(self, holder: str, floor: int = 0, store: EtcdStore | None = None) -> Acquired:
        store = store or self.h.store
        result = await _acquire(store, self.ns, holder, floor)
        if not isinstance(result, Acquired):
            self.h.clock.now += 31  # the current generation expires on the stores' clock
            if store is not self.h.store:
                assert isinstance(store.clock, FakeClock)
                store.clock.now = self.h.clock.now
            result = await _acquire(store, self.ns, holder, floor)
        assert isinstance(result, Acquired), f"grant to {holder} frozen: {result}"
        self.history.add(Grant(self.now(), LEASE, holder, result.token, result.lease_id))
        return result

    async def write(self, grant: Acquired, holder: str) -> str:
        """A fenced write of the artifact with ``grant``'s token: "ok" or the denial code."""
        op = uuid.uuid4().hex[:8]
        self.history.add(
            WriteInvoke(self.now(), op, LEASE, holder, grant.token, grant.lease_id, ART)
        )
        body = artifact(self.ns, ART, LEASE, grant.token, f"reports/{holder}-{op}")
        out = await publish(self.h.custom, body)
        if out.ok:
            self.history.add(WriteOk(self.now(), op))
            return "ok"
        found = _CODE.search(out.message)
        code = found.group(0) if found else f"http_{out.status}"
        self.history.add(WriteFail(self.now(), op, code))
        return code


async def _acquire(store: EtcdStore, ns: str, holder: str, floor: int) -> object:
    """An acquire, retried (bounded) while the channel reconnects to a restarted etcd: gRPC
    shares a subchannel per address, and the one that saw etcd gone backs off for a while."""
    refused: StoreUnavailable | None = None
    for _ in range(80):  # 20 s
        try:
            return await store.acquire(ns, LEASE, holder, 30, token_floor=floor)
        except StoreUnavailable as error:
            if error.code != "etcd_error":
                return error
            refused = error
        await asyncio.sleep(0.25)
    return refused


async def _restore(*argv: str) -> int:
    # In a thread: `--from-cluster` runs its own event loop.
    return await asyncio.to_thread(main, ["etcd", "restore", *argv])


async def test_restore_of_an_older_snapshot_keeps_every_token_above_accepted_ones(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    rng = random.Random()
    client_port, peer_port = reserved_port(rng), reserved_port(rng)
    peer = f"http://127.0.0.1:{peer_port}"

    def server(data: str) -> EtcdServer:
        return EtcdServer(tmp_path / data, tmp_path / f"{data}.log", client_port, peer_port)

    etcd = server("original")
    etcd.start()
    h = await start_harness(cluster, tmp_path / "tls", etcd_endpoint=etcd.endpoint)
    try:
        ns = await h.namespace()
        await h.lease(ns, LEASE)
        run = Run(h, ns)
        for i in range(3):
            assert await run.write(await run.grant(f"w{i}"), f"w{i}") == "ok"

        # The backup: a snapshot into the backup directory, then the CronJob's retention step.
        backups = tmp_path / "backups"
        backups.mkdir()
        with (backups / ".incoming.db").open("wb") as out:
            await h.store.client.snapshot(out)
        rotate = ["etcd", "backups", "rotate", f"--dir={backups}", "--prefix=fl-etcd", "--keep=2"]
        assert main(rotate) == 0
        [snapshot] = backups.glob("fl-etcd-*.db")

        # Work goes on after the snapshot: these grants and writes are not in it.
        late: dict[str, Acquired] = {}
        for i in range(3, 8):
            late[f"w{i}"] = await run.grant(f"w{i}")
            assert await run.write(late[f"w{i}"], f"w{i}") == "ok"
        issued = max(g.token for g in run.history.of(Grant))

        # etcd is lost entirely.
        lost = run.now()
        etcd.stop()
        shutil.rmtree(etcd.data_dir)

        # The restore command refuses a target that is not empty.
        taken = tmp_path / "taken"
        (taken / "member").mkdir(parents=True)
        assert await _restore(str(snapshot), f"--data-dir={taken}") == 4

        # Restore the older snapshot. `--bump-revision 1` on purpose: the bump must come from
        # the tokens the cluster shows (--from-cluster), not from a generous default.
        restored = tmp_path / "restored"
        code = await _restore(
            str(snapshot),
            f"--data-dir={restored}",
            "--name=default",
            f"--initial-advertise-peer-urls={peer}",
            "--bump-revision=1",
            "--from-cluster",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--etcdutl={binary_path('etcdutl')}",
        )
        assert code == 0
        etcd = server("restored")
        etcd.start()
        run.history.add(Fault(lost, "etcd_kill", run.now(), "etcd"))
        await h.store.close()  # a new channel to the restored etcd

        # Stale writers right after the restore: the artifact still shows w7's token.
        assert await run.write(late["w4"], "w4") != "ok"
        # An operator restarted with the restore (no memory) grants above its signed floor:
        # the highest token its lease statuses show, here the last grant before the loss.
        # Each holder writes before the next grant supersedes it.
        fresh = EtcdStore([etcd.endpoint], prefix=h.settings.etcd_prefix, clock=FakeClock())
        new = []
        try:
            for i in range(3):
                new.append(g := await run.grant(f"n{i}", floor=issued, store=fresh))
                assert g.token > issued, (issued, g.token)
                assert await run.write(g, f"n{i}") == "ok"
        finally:
            await fresh.close()
        # The last holder before the loss is refused: its grant came after the snapshot, so the
        # restored etcd has no record of it (unknown_token), and it is below the artifact's.
        assert await run.write(late["w7"], "w7") in ("unknown_token", "stale_fence")
        # The first holder after the restore is behind the newer grants' writes.
        assert await run.write(new[0], "n0") == "stale_fence"

        report = check(run.history)
        assert report.safe, [v.detail for v in report.violations]
        assert report.admitted == 3 + 5 + 3
        assert sum(report.refused.values()) == 3

        # The control: the same snapshot restored as is (no bump).
        etcd.stop()
        etcd = server("unbumped")
        control_dir = tmp_path / "unbumped"
        from .test_store_etcd import _etcdutl_restore

        _etcdutl_restore(snapshot, control_dir, peer_port)
        etcd.start()
        # With the operator's floor the restore guard freezes every grant ...
        guarded = EtcdStore([etcd.endpoint], prefix=h.settings.etcd_prefix, clock=FakeClock())
        naive = EtcdStore([etcd.endpoint], prefix=h.settings.etcd_prefix, clock=FakeClock())
        try:
            frozen = await _acquire(guarded, ns, "c0", issued)
            assert isinstance(frozen, StoreUnavailable) and frozen.code == "restore_guard", frozen
            # ... and without it, an old number is issued again: the checker reports it.
            reissued = await _acquire(naive, ns, "c1", 0)
            if not isinstance(reissued, Acquired):  # the snapshot's generation expires first
                naive.clock.now += 31  # type: ignore[attr-defined]
                reissued = await _acquire(naive, ns, "c1", 0)
            assert isinstance(reissued, Acquired) and reissued.token <= issued
        finally:
            await guarded.close()
            await naive.close()
        control = replace(run.history, events=list(run.history.events))
        control.add(Grant(run.now(), LEASE, "c1", reissued.token, reissued.lease_id))
        kinds = {v.kind for v in check(control).violations}
        assert "token_not_increasing" in kinds, kinds
    finally:
        await stop_harness(h)
        etcd.stop()
