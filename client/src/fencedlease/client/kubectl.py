"""``kubectl fencedlease status|describe|force-release``: the kubectl plugin.

Installed as the console script ``kubectl-fencedlease``; kubectl finds it on ``PATH`` (or
``kubectl krew install``: plugins/krew/fencedlease.yaml).  kubectl's conventions: flags
``--kubeconfig``, ``--context`` and ``-n/--namespace`` before or after the subcommand (they are
parsed here: kubectl does not pass its own flags to plugins), ``-A/--all-namespaces``,
``-o table|wide|json|yaml`` (``json``/``yaml``: the object for a name, else a ``List``).

``force-release LEASE`` takes the lease id from ``status.leaseId`` and sets the annotation the
operator reads (``fencedlease.io/force-release``), so nothing is copied by hand.  It does not
stop the old holder's process: only a newer token accepted at the resource does that
(docs/operations.md).

Exit codes (the one table of every command: :mod:`fencedlease.client.cli`, docs/client.md):
0 done, 1 error (API, config), 2 usage (also a name or namespace the API server would not
take), 3 not found, 4 nothing to release.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

from fencedlease.client.api import (
    KubeClient,
    KubeConfig,
    artifact_path,
    events_path,
    lease_path,
    pod_path,
)
from fencedlease.client.cli_common import (
    EXIT_ABSENT,
    EXIT_ERROR,
    EXIT_USAGE,
    Parser,
    cli_error,
    lease_id_arg,
    named,
    namespace_arg,
    seconds_arg,
    timeout_arg,
)
from fencedlease.client.contract import (
    ANNOTATION_FORCE_RELEASE,
    GROUP,
    LEASES,
    VERSION,
    annotation_keys,
)
from fencedlease.client.errors import ApiError, FencedLeaseError
from fencedlease.client.grant import parse_time
from fencedlease.client.validation import InvalidInput
from fencedlease.client.version import client_version

EXIT_NOT_FOUND = EXIT_ABSENT
EXIT_NOTHING = 4


OUTPUTS = ("table", "wide", "json", "yaml")
"""``-o``: a table (the default), a wider table, or the objects as kubectl prints them."""


def _kubectl_flags() -> Parser:
    """kubectl's flags, accepted before and after the subcommand (kubectl does not pass its own
    flags to plugins: they are parsed here).  ``SUPPRESS``: a flag given in either place wins
    over the other place's absence."""
    flags = Parser(add_help=False)
    flags.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file(s)")
    flags.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context")
    flags.add_argument(
        "-n",
        "--namespace",
        type=namespace_arg,
        default=argparse.SUPPRESS,
        help="default: the context's",
    )
    flags.add_argument(
        "--request-timeout",
        type=timeout_arg,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="give up on one API request after this long (default 10)",
    )
    return flags


def build_parser() -> argparse.ArgumentParser:
    flags = _kubectl_flags()
    parser = Parser(
        prog="kubectl fencedlease",
        description="Inspect FencedLeases and force-release them.",
        parents=[flags],
    )
    parser.add_argument(
        "--version", action="version", version=f"kubectl-fencedlease {client_version()}"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, **lease: Any) -> argparse.ArgumentParser:
        """A subcommand with kubectl's flags and its ``lease`` argument."""
        p: argparse.ArgumentParser = sub.add_parser(name, parents=[flags], help=help)
        p.add_argument("lease", type=named("FencedLease"), **lease)
        return p

    status = command("status", "one line per lease: phase, holder, token, renewal", nargs="?")
    status.add_argument("-A", "--all-namespaces", action="store_true")
    describe = command("describe", "a lease with its holder's annotations, artifacts and events")
    for listing in (status, describe):
        listing.add_argument("-o", "--output", choices=OUTPUTS, default="table")
    ended = "end the current generation (lease id taken from the status)"
    release = command("force-release", ended)
    release.add_argument(
        "--lease-id",
        type=lease_id_arg,
        help="release only this generation (default: the one in the status)",
    )
    release.add_argument(
        "--wait",
        type=seconds_arg,
        default=0.0,
        metavar="SECONDS",
        help="wait until the operator acted (the annotation is gone)",
    )
    return parser


def _print_objects(objects: list[dict[str, Any]], output: str, single: bool) -> None:
    """``-o json|yaml`` as kubectl prints them: the object for a name, else a ``List``."""
    doc: dict[str, Any] = (
        objects[0]
        if single
        else {"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {}}
    )
    if output == "json":
        print(json.dumps(doc, indent=4))
    else:
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False), end="")


def _age(value: object, now: dt.datetime) -> str:
    if not value:
        return "-"
    if not isinstance(value, str):
        return repr(value)[:40]
    try:
        seconds = (parse_time(value) - now).total_seconds()
    except (ValueError, OverflowError):
        return value[:40]
    sign = "in " if seconds >= 0 else ""
    suffix = "" if seconds >= 0 else " ago"
    return f"{sign}{abs(int(seconds))}s{suffix}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_status(kube: KubeClient, ns: str, args: argparse.Namespace) -> int:
    if args.lease:
        items = [kube.get(lease_path(ns, args.lease))]
    elif args.all_namespaces:
        items = kube.get(f"/apis/{GROUP}/{VERSION}/{LEASES}").get("items") or []
    else:
        items = kube.get(lease_path(ns)).get("items") or []
    items = [i for i in items if isinstance(i, dict)]
    if args.output in ("json", "yaml"):
        _print_objects(items, args.output, single=bool(args.lease))
        return 0
    if not items:
        where = "any namespace" if args.all_namespaces else f"{ns} namespace"
        print(f"No FencedLeases found in {where}.", file=sys.stderr)
        return 0
    now = dt.datetime.now(dt.timezone.utc)
    wide = args.output == "wide"
    header = ["NAME", "PHASE", "HOLDER", "TOKEN", "RENEWED"]
    if wide:
        header += ["LEASE-ID", "DURATION", "POLICY", "TRANSITIONS", "ACQUIRED"]
    if args.all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = [header]
    for item in items:
        s = _summary(item)
        spec = item["spec"] if isinstance(item.get("spec"), dict) else {}
        row = [
            str(s["name"]),
            str(s["phase"] or "-"),
            str(s["holder"] or "-"),
            str(s["fencingToken"] or "-"),
            _age(s["renewTime"], now),
        ]
        if wide:
            row += [
                str(s["leaseId"] or "-"),
                _seconds(spec.get("leaseDurationSeconds")),
                str(spec.get("fencingPolicy") or "AllowEqual"),
                str(s["transitions"] if s["transitions"] is not None else "-"),
                _age(s["acquireTime"], now),
            ]
        if args.all_namespaces:
            row.insert(0, str(s["namespace"]))
        rows.append(row)
    print(_table(rows))
    return 0


def _seconds(value: Any) -> str:
    """A status number as shown (a status is written by others: anything else is shown as
    it is, never parsed into a traceback)."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):g}s"
    return repr(value)[:40]


def _summary(item: dict[str, Any]) -> dict[str, Any]:
    meta, status = item.get("metadata") or {}, item.get("status") or {}
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "phase": status.get("phase"),
        "holder": status.get("holder"),
        "fencingToken": status.get("fencingToken"),
        "leaseId": status.get("leaseId"),
        "acquireTime": status.get("acquireTime"),
        "renewTime": status.get("renewTime"),
        "leaseDurationSeconds": status.get("leaseDurationSeconds"),
        "renewIntervalSeconds": status.get("renewIntervalSeconds"),
        "transitions": status.get("transitions"),
    }


def _holder_lines(kube: KubeClient, ns: str, lease: str, holder: Any) -> list[str]:
    """What the holder Pod's annotations show (its downward-API files), for ``describe``."""
    out: list[str] = []
    try:
        holder_path = pod_path(ns, holder) if holder else None
    except InvalidInput:  # a status is written by others: shown, never put into a URL
        return [f"Holder Pod {str(holder)[:80]!r}: not a Pod name, not read"]
    if holder_path is None:
        return out
    reply = kube.request("GET", holder_path)
    if reply.ok:
        ann = ((reply.json().get("metadata") or {}).get("annotations")) or {}
        out.append(f"Holder Pod {holder} annotations (what its downward-API files show):")
        for field, key in annotation_keys(lease).items():
            out.append(f"  {field}: {ann.get(key, '-')}")
    else:
        out.append(f"Holder Pod {holder}: not readable ({reply.status_code})")
    return out


def cmd_describe(kube: KubeClient, ns: str, args: argparse.Namespace) -> int:
    obj = kube.get(lease_path(ns, args.lease))
    if args.output in ("json", "yaml"):
        _print_objects([obj], args.output, single=True)
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    out = [
        f"Name:          {args.lease}",
        f"Namespace:     {ns}",
        f"Duration:      {spec.get('leaseDurationSeconds')}s",
        f"Policy:        {spec.get('fencingPolicy', 'AllowEqual')}",
        f"Selector:      {json.dumps(spec.get('holderSelector') or {})}",
        f"Phase:         {status.get('phase') or '-'}",
        f"Holder:        {status.get('holder') or '-'}",
        f"Token:         {status.get('fencingToken') or '-'}",
        f"Lease id:      {status.get('leaseId') or '-'}",
        f"Acquired:      {status.get('acquireTime') or '-'}",
        f"Renewed:       {status.get('renewTime') or '-'}",
        f"Renew every:   {_seconds(status.get('renewIntervalSeconds'))} (each renewal's deadline: "
        "valid-until on the holder Pod)",
        f"Transitions:   {status.get('transitions', 0)}",
    ]
    pending = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_FORCE_RELEASE)
    if pending:
        out.append(f"Force release: requested for lease id {pending} (not yet acted on)")
    conditions = status.get("conditions") or []
    if conditions:
        out.append("Conditions:")
        for c in conditions:
            out.append(
                f"  {c.get('type')}={c.get('status')} ({c.get('reason')}): {c.get('message', '')}"
            )
    out.extend(_holder_lines(kube, ns, args.lease, status.get("holder")))
    artifacts = kube.get(artifact_path(ns)).get("items") or []
    mine = [
        a
        for a in artifacts
        if ((a.get("spec") or {}).get("leaseRef") or {}).get("name") == args.lease
    ]
    out.append("Artifacts:" if mine else "Artifacts:     none")
    rows = [["NAME", "TOKEN", "OBJECT", "OPERATION", "ACCEPTED"]]
    for a in mine:
        sp, st = a.get("spec") or {}, a.get("status") or {}
        rows.append(
            [
                (a.get("metadata") or {}).get("name", ""),
                str(sp.get("fencingToken", "-")),
                str(sp.get("objectRef", "-")),
                str(sp.get("operationId") or "-"),
                str(st.get("acceptedFence") or "-"),
            ]
        )
    if mine:
        out.extend("  " + line for line in _table(rows).splitlines())
    reply = kube.request(
        "GET",
        events_path(ns),
        params={"fieldSelector": f"involvedObject.name={args.lease}"},
    )
    events = (reply.json().get("items") or []) if reply.ok else []
    events.sort(
        key=lambda e: str(
            e.get("lastTimestamp")
            or e.get("eventTime")
            or (e.get("metadata") or {}).get("creationTimestamp")
            or ""
        )
    )
    if events:
        out.append("Events:")
        for e in events[-10:]:
            out.append(f"  {e.get('type')}  {e.get('reason')}  {e.get('message', '')}")
    print("\n".join(out))
    return 0


def cmd_force_release(kube: KubeClient, ns: str, args: argparse.Namespace) -> int:
    obj = kube.get(lease_path(ns, args.lease))
    status = obj.get("status") or {}
    lease_id = args.lease_id or status.get("leaseId")
    if not lease_id or (args.lease_id is None and status.get("phase") != "Held"):
        print(
            f"lease {ns}/{args.lease} has no held generation to release "
            f"(phase {status.get('phase') or '-'})",
            file=sys.stderr,
        )
        return EXIT_NOTHING
    patch = {"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: str(lease_id)}}}
    kube.request(
        "PATCH", lease_path(ns, args.lease), body=patch, content_type="application/merge-patch+json"
    ).raise_for_status()
    print(
        f"force-release of lease {ns}/{args.lease} generation {lease_id} (token "
        f"{status.get('fencingToken')}, holder {status.get('holder')}) requested.\n"
        "The old holder is NOT stopped: it is only fenced once a newer token is accepted at the "
        "resource.",
        file=sys.stderr,
    )
    if args.wait > 0:
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            current = kube.get(lease_path(ns, args.lease))
            ann = (current.get("metadata") or {}).get("annotations") or {}
            if ANNOTATION_FORCE_RELEASE not in ann:
                st = current.get("status") or {}
                print(
                    f"done: phase {st.get('phase')}, holder {st.get('holder') or '-'}, "
                    f"token {st.get('fencingToken') or '-'}",
                    file=sys.stderr,
                )
                return 0
            time.sleep(0.5)
        print(f"the operator has not acted within {args.wait}s", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "all_namespaces", False) and args.lease:
        print(
            "error: a resource cannot be retrieved by name across all namespaces",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        config = KubeConfig.load(
            getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
            timeout=getattr(args, "request_timeout", None),
        )
        ns = getattr(args, "namespace", None) or config.namespace
        with KubeClient(config) as kube:
            if args.command == "status":
                return cmd_status(kube, ns, args)
            if args.command == "describe":
                return cmd_describe(kube, ns, args)
            return cmd_force_release(kube, ns, args)
    except ApiError as exc:
        print(cli_error(exc), file=sys.stderr)
        return EXIT_NOT_FOUND if exc.status_code == 404 and not exc.not_installed else EXIT_ERROR
    except FencedLeaseError as exc:
        print(cli_error(exc), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
