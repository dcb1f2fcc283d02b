"""Draw docs/creep.png: a student's speed over one lap, with the steps off the road shaded.

Usage (the .npz files come from ``drive --headless --dump-traces``; README, "The creep rule"):

    drive --policy runs/polA.pt --track-seed 700002 --headless --no-overlay --dump-traces a.npz
    drive --policy runs/polE.pt --track-seed 700002 --headless --no-overlay --dump-traces e.npz
    python docs/creep_trace.py a.npz e.npz --label "without the rule" "with --creep-speed 10" --out docs/creep.png

One panel per file: the car's speed (simulator units per second) at every step, the steps with
all four wheels off the road shaded, the steering actions marked, and the standstill (1 unit/s)
and crawl (5 units/s) thresholds of ``agent evaluate`` drawn across.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz", nargs="+", help="drive --dump-traces files, one lap each")
    p.add_argument("--label", nargs="*", default=None, help="one title per file (default: file stem)")
    p.add_argument("--out", default="docs/creep.png")
    args = p.parse_args(argv)
    if args.label and len(args.label) != len(args.npz):
        p.error(f"--label takes one label per file: got {len(args.label)} labels for {len(args.npz)} files")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent.actors.rollout import CRAWL_METRIC_SPEED
    from envs.carracing import STANDSTILL_SPEED

    fig, axes = plt.subplots(len(args.npz), 1, figsize=(10, 2.6 * len(args.npz)), sharex=True, squeeze=False)
    for i, f in enumerate(args.npz):
        d = np.load(f, allow_pickle=False)
        speed, off = np.asarray(d["speed"], float), np.asarray(d["off_road"], bool)
        names = [str(n) for n in d["action_names"]]
        action = np.asarray(d["action"]).astype(int)
        steps = np.arange(len(speed))
        ax = axes[i, 0]
        ax.fill_between(steps, 0, max(speed.max(), 10) * 1.05, where=off, color="tab:green", alpha=0.25, lw=0,
                        label="all four wheels off the road")
        ax.plot(steps, speed, color="k", lw=1, label="speed")
        for name, colour in (("left", "tab:blue"), ("right", "tab:orange")):
            if name in names:
                m = action == names.index(name)
                ax.plot(steps[m], np.full(m.sum(), -2.0), "|", color=colour, ms=6, label=f"steer {name}")
        ax.axhline(STANDSTILL_SPEED, color="tab:red", ls=":", lw=1)
        ax.axhline(CRAWL_METRIC_SPEED, color="tab:red", ls="--", lw=1, label=f"{CRAWL_METRIC_SPEED:g} units/s")
        ret = float(np.sum(d["reward"]))
        title = args.label[i] if args.label else Path(f).stem
        ax.set_title(f"{title}: return {ret:.1f}, {int(off.sum())} steps off the road", fontsize=10)
        ax.set_ylabel("speed (units/s)")
        ax.set_ylim(-4, max(speed.max(), 10) * 1.05)
        if i == 0:
            ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("step (50 per second)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
