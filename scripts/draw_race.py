"""Draw docs/race.png: the README's sequence diagram of the expiry race and the fence.

The same story as the README's mermaid diagram (for viewers that do not render mermaid):

    .venv/bin/python scripts/draw_race.py [--out docs/race.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

ROOT = Path(__file__).resolve().parents[1]
LANES = {
    "A": (0.0, "writer A"),
    "L": (3.0, "fencedlease\n(operator + etcd)"),
    "B": (6.0, "writer B"),
    "R": (9.0, "API server +\nfence webhook"),
}
RED, GREEN, GREY, BLUE = "#c0392b", "#1e8449", "#555555", "#1f4e79"

# (kind, from, to, text, colour): kind "msg" is an arrow, "note" a box over a lane.
STEPS: list[tuple[str, str, str, str, str]] = [
    ("msg", "L", "A", "grant: token 41", BLUE),
    ("note", "A", "A", "A freezes (GC pause, SIGSTOP,\npartition): stops renewing", GREY),
    ("note", "L", "L", "A's lease expires\n(not renewed)", GREY),
    ("msg", "L", "B", "grant: token 57", BLUE),
    ("msg", "B", "R", "write report, token 57", BLUE),
    ("reply", "R", "B", "applied: high-water mark 57", GREEN),
    ("note", "A", "A", "A thaws, still believes\nit holds the lease", GREY),
    ("msg", "A", "R", "queued write, token 41", BLUE),
    ("reply", "R", "A", "refused: stale_fence: token 41 is below the high-water mark 57", RED),
    ("note", "R", "R", "the resource keeps\nB's report", GREEN),
]


def _x(lane: str) -> float:
    return LANES[lane][0]


def _draw_step(ax: Axes, y: float, step: tuple[str, str, str, str, str]) -> None:
    kind, src, dst, text, colour = step
    if kind == "note":
        ax.text(
            _x(src),
            y,
            text,
            ha="center",
            va="center",
            fontsize=9,
            color=colour if colour != GREY else "#222222",
            bbox={"boxstyle": "round,pad=0.35", "fc": "#fff8dc", "ec": "#b7950b", "lw": 0.8},
            zorder=3,
        )
        return
    ax.annotate(
        "",
        xy=(_x(dst), y),
        xytext=(_x(src), y),
        arrowprops={
            "arrowstyle": "-|>",
            "color": colour,
            "lw": 1.6,
            "linestyle": "-" if kind == "msg" else "--",
        },
        zorder=2,
    )
    mid = (_x(src) + _x(dst)) / 2
    ax.text(
        mid,
        y + 0.18,
        text,
        ha="center",
        va="bottom",
        fontsize=9,
        color=colour,
        fontweight="bold" if colour == RED else "normal",
        zorder=3,
    )


def draw(out: Path) -> None:
    rows = len(STEPS)
    fig, ax = plt.subplots(figsize=(10.5, 0.62 * rows + 1.6), dpi=110)
    top, bottom = 0.0, -(rows + 0.4)
    for x, title in LANES.values():
        ax.plot([x, x], [top - 0.2, bottom], color="#999999", lw=1, ls=":", zorder=1)
        ax.text(
            x,
            top + 0.25,
            title,
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.4", "fc": "#eaf2f8", "ec": BLUE, "lw": 1},
        )
    for i, step in enumerate(STEPS):
        _draw_step(ax, -(i + 0.6), step)
    ax.set_xlim(-1.6, 10.6)
    ax.set_ylim(bottom - 0.2, top + 1.3)
    ax.axis("off")
    ax.set_title(
        "The expiry race, and the fence that stops it", fontsize=12, fontweight="bold", pad=4
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "race.png")
    args = parser.parse_args()
    draw(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
