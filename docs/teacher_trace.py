"""Draw docs/teacher-failures.png: where a student's lap goes wrong, next to what its teacher would do.

Usage (the .npz files come from ``drive --teacher.expert ... --dump-traces``; README, "Where the last
failures begin"):

    drive --policy nac.pt --track-seed 700169 --headless --no-saliency \\
        --teacher.expert carracing-expert-discrete-margin.zip --teacher.creep-speed 10 --dump-traces t169.npz
    python docs/teacher_trace.py t169.npz t139.npz t126.npz --out docs/teacher-failures.png

One panel per file: the car's speed (simulator units per second) at every step, the steps with all
four wheels off the road shaded, and two rows of marks under it, the policy's actions and the
teacher's label of the same state (steering left, right and brake; gas and nothing unmarked).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MARKED = (("left", "tab:blue"), ("right", "tab:orange"), ("brake", "tab:red"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz", nargs="+", help="drive --teacher.expert --dump-traces files, one lap each")
    p.add_argument("--label", nargs="*", default=None, help="one title per file (default: file stem)")
    p.add_argument("--out", default="docs/teacher-failures.png")
    args = p.parse_args(argv)
    if args.label and len(args.label) != len(args.npz):
        p.error(f"--label takes one label per file: got {len(args.label)} labels for {len(args.npz)} files")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent.drive.traces import load_traces

    fig, axes = plt.subplots(len(args.npz), 1, figsize=(10, 2.8 * len(args.npz)), sharex=True, squeeze=False)
    for i, f in enumerate(args.npz):
        d = load_traces(f)
        if "teacher_class" not in d:
            p.error(f"{f} has no teacher labels: write it with drive --teacher.expert EXPERT.zip --dump-traces")
        speed, off = np.asarray(d["speed"], float), np.asarray(d["off_road"], bool)
        names = [str(n) for n in d["class_names"]]
        mine, teacher = np.asarray(d["action_class"], int), np.asarray(d["teacher_class"], int)
        steps = np.arange(1, len(speed) + 1)
        top = max(speed.max(), 10) * 1.05
        ax = axes[i, 0]
        ax.fill_between(steps, 0, top, where=off, color="tab:green", alpha=0.25, lw=0,
                        label="all four wheels off the road")
        ax.plot(steps, speed, color="k", lw=1, label="speed")
        for row, (who, cls) in enumerate((("policy", mine), (str(d["teacher"]), teacher))):
            y = -0.09 * top * (row + 1)
            for name, colour in MARKED:
                if name in names:
                    m = cls == names.index(name)
                    ax.plot(steps[m], np.full(m.sum(), y), "|", color=colour, ms=5,
                            label=name if (i == 0 and row == 0) else None)
            ax.text(steps[-1] + 8, y, "policy" if row == 0 else "teacher", fontsize=7, va="center")
        ax.axhline(10, color="tab:gray", ls="--", lw=0.8)
        title = args.label[i] if args.label else Path(f).stem
        agree = 100 * float(np.mean(mine == teacher))
        ax.set_title(f"{title}: return {float(np.sum(d['reward'])):.1f}, {int(off.sum())} steps off the road, "
                     f"the policy chose the teacher's action on {agree:.1f} % of steps", fontsize=9)
        ax.set_ylabel("speed (units/s)")
        ax.set_ylim(-0.22 * top, top)
        if i == 0:
            ax.legend(loc="upper right", fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("step (50 per second); dashed: 10 units/s, below which the teacher's label is gas")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
