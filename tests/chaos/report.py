"""The campaign's report: a markdown summary and a PNG timeline per run (matplotlib).

The timeline has one panel per lease: admitted writes as dots at (time, token), coloured by
holder; refused writes as crosses; fault windows shaded by kind. Tokens jump by a million after
a restore with ``--bump-revision``, so the token axis is logarithmic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tests.chaos.checker import Report
from tests.chaos.history import Fault, History, WriteFail, WriteInvoke, WriteOk

FAULT_COLOURS = {
    "pause": "tab:orange",
    "partition": "tab:red",
    "duplicate": "tab:olive",
    "reorder": "tab:cyan",
    "ready_flap": "tab:gray",
    "operator_kill": "tab:purple",
    "webhook_down": "black",
    "etcd_member_kill": "tab:brown",
    "etcd_leader_kill": "tab:pink",
    "etcd_down": "tab:blue",
    "restore_no_bump": "tab:green",
    "restore_bump": "lime",
}

Run = tuple[object, dict[str, int], History, Report]


def timeline(history: History, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    writes = {w.op_id: w for w in history.of(WriteInvoke)}
    t0 = min((e.t for e in history.events), default=0.0)
    leases = sorted(history.policies)
    holders = sorted({w.holder for w in writes.values()})
    cmap = plt.get_cmap("tab10")
    colour = {h: cmap(i % 10) for i, h in enumerate(holders)}
    fig, axes = plt.subplots(len(leases), 1, figsize=(14, 2.6 * len(leases)), sharex=True)
    if len(leases) == 1:
        axes = [axes]
    faults = list(history.of(Fault))
    for ax, lease in zip(axes, leases, strict=True):
        for fault in faults:
            ax.axvspan(
                fault.t - t0,
                fault.end - t0,
                color=FAULT_COLOURS.get(fault.kind, "yellow"),
                alpha=0.12,
                lw=0,
            )
        for holder in holders:
            xs, ys = [], []
            for ok in history.of(WriteOk):
                w = writes.get(ok.op_id)
                if w is not None and w.lease == lease and w.holder == holder:
                    xs.append(ok.t - t0)
                    ys.append(w.token)
            ax.scatter(xs, ys, s=6, color=colour[holder], label=holder)
        fx, fy = [], []
        for fail in history.of(WriteFail):
            w = writes.get(fail.op_id)
            if w is not None and w.lease == lease and fail.code != "unavailable":
                fx.append(fail.t - t0)
                fy.append(w.token)
        ax.scatter(fx, fy, s=18, marker="x", color="red", label="refused")
        ax.set_yscale("log")
        ax.set_ylabel(f"{lease}\n({history.policies[lease]})\ntoken")
    axes[0].legend(loc="upper left", fontsize=6, ncol=len(holders) + 1)
    axes[-1].set_xlabel(
        "seconds; shaded: fault windows (" + ", ".join(sorted({f.kind for f in faults})) + ")"
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summary(profile: object, counts: dict[str, int], history: History, report: Report) -> str:
    name = getattr(profile, "name", "?")
    seed = getattr(profile, "seed", "?")
    invokes = list(history.of(WriteInvoke))
    span = (
        (max(e.t for e in history.events) - min(e.t for e in history.events))
        if history.events
        else 0.0
    )
    windows = Counter(f.kind for f in history.of(Fault))
    lines = [
        f"## `{name}` (seed {seed}): {'SAFE' if report.safe else 'UNSAFE'}",
        "",
        f"- {len(invokes)} writes sent in {span:.0f} s by"
        f" {len({w.holder for w in invokes})} holders on {len(history.policies)} leases;"
        f" {report.admitted} admitted;"
        " refused: " + (", ".join(f"{c} {k}" for k, c in sorted(report.refused.items())) or "none"),
        "- faults: "
        + (", ".join(f"{c} {k}" for k, c in sorted(windows.items())) or "none")
        + f" (nemesis counts: {dict(sorted(counts.items()))})",
        f"- violations: {len(report.violations)}"
        + (
            " — "
            + ", ".join(f"{c} {k}" for k, c in Counter(v.kind for v in report.violations).items())
            if report.violations
            else ""
        ),
    ]
    for violation in report.violations[:5]:
        lines.append(f"  - `{violation.kind}`: {violation.detail}")
    av = report.availability
    if av.held_share:
        lines.append(
            "- held share: "
            + ", ".join(f"{k} {v:.0%}" for k, v in sorted(av.held_share.items()))
            + "; grants/min: "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(av.grants_per_minute.items()))
        )
    by_kind: dict[str, list[float]] = {}
    for fault, recovery in av.recovery_seconds:
        if recovery is not None:
            by_kind.setdefault(fault.kind, []).append(recovery)
    if by_kind:
        lines.append("")
        lines.append("| fault | windows | recovery p50 (s) | max (s) |")
        lines.append("|---|---|---|---|")
        for kind, values in sorted(by_kind.items()):
            values.sort()
            p50, worst = values[len(values) // 2], values[-1]
            lines.append(f"| {kind} | {windows.get(kind, 0)} | {p50:.2f} | {worst:.2f} |")
    return "\n".join(lines)


def write_report(runs: Sequence[Run], out: Path) -> str:
    parts = ["# Fault campaign report", ""]
    for profile, counts, history, report in runs:
        name = getattr(profile, "name", "run")
        png = out / f"timeline-{name}.png"
        timeline(history, png, f"{name}: tokens per lease over time")
        parts += [summary(profile, counts, history, report), "", f"![timeline]({png.name})", ""]
    md = "\n".join(parts)
    (out / "report.md").write_text(md)
    return md
