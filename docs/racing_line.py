"""Draw docs/racing-line.png: where each driver puts the car in one bend, and which tiles it skips.

Usage (validation track 700,000, the S-bend where ``nac-continuous.pt`` skips tiles 129-131):

    python docs/racing_line.py --seed 700000 --tiles 110 140 \\
        --policy nac-continuous.pt carracing-expert-margin.zip \\
        --out docs/racing-line.png

Each policy drives the track (the expert from privileged state, a student from the rendered
frames, as in ``agent evaluate``). The road tiles of the chosen range are drawn in grey, with the
ones a policy never visited in the whole episode outlined in its colour; each policy's path (the
car's centre, first lap) is a line, solid while at least one wheel touches the road and dotted
while all four are on the grass. A CarRacing lap ends only once every tile has been visited, so a
skipped tile costs the rest of the episode (:func:`agent.actors.rollout.tiles_missed`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def drive(path: str, seed: int):
    """(positions (N, 2), all wheels off (N,) bool, tiles never visited (set), road polygons, return)."""
    import torch

    from agent.actors.loading import load_policy, make_actor, make_carracing_for
    from agent.experts.policy import ExpertPolicy

    torch.set_num_threads(1)
    policy = load_policy(path)
    actor = make_actor(policy, deterministic=True)
    env = make_carracing_for(policy, render_pixels=not isinstance(policy, ExpertPolicy))
    obs, info = env.reset(seed=seed)
    actor.reset()
    u = env.unwrapped
    pos, off, total = [], [], 0.0
    for _ in range(1000):
        obs, r, term, trunc, info = env.step(actor.act(obs, env, info).action)
        total += float(r)
        pos.append(tuple(u.car.hull.position))
        off.append(not any(w.tiles for w in u.car.wheels))
        if term or trunc:
            break
    missed = {i for i, tile in enumerate(u.road) if not tile.road_visited}
    polys = [np.asarray(tile.fixtures[0].shape.vertices, dtype=float) for tile in u.road]  # tile i's quadrilateral
    env.close()
    return np.asarray(pos), np.asarray(off), missed, polys, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=700_000, help="track (a validation track by default)")
    p.add_argument("--tiles", type=int, nargs=2, default=(110, 140), metavar=("FIRST", "LAST"),
                   help="the range of road tiles to draw")
    p.add_argument("--policy", nargs="+", required=True, help="policy files (.pt students, .zip experts)")
    p.add_argument("--out", default="docs/racing-line.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon

    lo, hi = args.tiles
    runs = [(name, *drive(name, args.seed)) for name in args.policy]
    polys = runs[0][4]
    n_tiles = len(polys)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    box = np.concatenate([polys[i % n_tiles] for i in range(lo, hi + 1)])
    for i in range(lo, hi + 1):
        ax.add_patch(Polygon(polys[i], closed=True, facecolor="0.85", edgecolor="0.7", lw=0.5))
        c = polys[i].mean(0)
        if i % 5 == 0:
            ax.text(c[0], c[1], str(i), fontsize=7, ha="center", va="center", color="0.4")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, pos, off, missed, _, total) in enumerate(runs):
        col = colours[k % len(colours)]
        inside = np.all((pos >= box.min(0) - 5) & (pos <= box.max(0) + 5), axis=1)
        first = np.flatnonzero(inside)
        if len(first):  # the first pass through the box only
            gaps = np.flatnonzero(np.diff(first) > 1)
            seg = first[: gaps[0] + 1] if len(gaps) else first
            xy, o = pos[seg], off[seg]
            ax.plot(xy[:, 0], xy[:, 1], color=col, lw=1.8,
                    label=f"{Path(name).name}: return {total:.0f}, {len(missed)} tiles never visited")
            ax.plot(np.where(o, xy[:, 0], np.nan), np.where(o, xy[:, 1], np.nan), color=col, lw=8, alpha=0.3)
        for i in sorted(missed):
            if lo <= i <= hi:
                ax.add_patch(Polygon(polys[i], closed=True, fill=False, edgecolor=col, lw=2, ls="--"))
    ax.set_xlim(box[:, 0].min() - 5, box[:, 0].max() + 5)
    ax.set_ylim(box[:, 1].min() - 5, box[:, 1].max() + 5)
    ax.set_aspect("equal")
    ax.set_title(f"track {args.seed}, tiles {lo}-{hi}: the car's centre on its first pass\n"
                 "(thick pale stretches: all four wheels on the grass; dashed outlines: tiles never visited)",
                 fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.01), fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
