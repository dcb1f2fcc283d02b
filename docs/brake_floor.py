"""Draw docs/brake-floor.png: the teacher's brake labels by car speed in DAgger rounds, and the brake floor.

Usage (README, "The brake floor"; the recordings are `agent train --dagger.save-rounds` rounds):

    python docs/brake_floor.py --before recordings/nac-drive/dcl{A,B,C,D,E,F,G}-dagger-r?-v0 \\
        --after recordings/nac-drive/dclI-dagger-r?-v0 --out docs/brake-floor.png

One bar per 1 unit/s of speed (simulator units per second, the speed recorded with each labelled
frame) from 0 to 60: how many frames the teacher labelled "brake". ``--before``: rounds labelled
with the start rule's floor at 10 units/s (brake becomes gas below it); ``--after``: rounds
labelled with ``--teacher.brake-floor 20``. The recordings are read one at a time.
"""

from __future__ import annotations

import argparse

import numpy as np

BINS = np.arange(0, 61, 1.0)


def brake_histogram(recordings: list[str]) -> tuple[np.ndarray, int, int]:
    """(len(BINS) - 1,) counts of brake labels per speed bin, the number of brake labels and of frames."""
    from agent.data.recordings import load_demonstrations
    from agent.experts.rules import BRAKE

    counts = np.zeros(len(BINS) - 1, np.int64)
    brakes = frames = 0
    for rec in recordings:
        demos = load_demonstrations(rec)
        for actions, speeds in zip(demos.actions, demos.frame_speeds()):
            b = actions == BRAKE
            counts += np.histogram(speeds[b], BINS)[0]
            brakes += int(b.sum())
            frames += len(actions)
        del demos
    return counts, brakes, frames


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", nargs="+", required=True, help="rounds labelled with the floor at 10 units/s")
    p.add_argument("--after", nargs="*", default=[], help="rounds labelled with --brake-floor 20")
    p.add_argument("--out", default="docs/brake-floor.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("before", args.before, 10.0)] + ([("after", args.after, 20.0)] if args.after else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.9 * len(panels)), sharex=True, squeeze=False)
    for ax, (name, recs, floor) in zip(axes[:, 0], panels):
        counts, brakes, frames = brake_histogram(recs)
        ax.bar(BINS[:-1], counts, width=1.0, align="edge", color="tab:red", alpha=0.8)
        ax.axvline(10.0, color="k", ls="--", lw=1)
        ax.axvline(20.0, color="tab:blue", ls="--", lw=1)
        below = int(counts[(BINS[:-1] >= 10) & (BINS[:-1] < 20)].sum())
        ax.set_title(f"{len(recs)} rounds labelled with the floor at {floor:.0f} units/s: {brakes:,} brake labels "
                     f"in {frames:,} frames, {below:,} at 10-20 units/s", fontsize=9)
        ax.set_ylabel("brake labels")
        ymax = ax.get_ylim()[1]
        ax.text(10.3, ymax * 0.9, "floor 10", fontsize=8)
        ax.text(20.3, ymax * 0.9, "floor 20", fontsize=8, color="tab:blue")
    axes[-1, 0].set_xlabel("car speed at the labelled frame (units/s); above 60 not shown")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
