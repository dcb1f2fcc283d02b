"""Draw docs/validation-seeds.png: how far apart the continuous students' validation laps are.

Usage (the JSONs come from ``agent evaluate --json`` on validation tracks 700,000-700,049;
``results/standstills/*-val50.json`` are the ones in the README):

    python docs/validation_seeds.py results/standstills/still-s0-val50.json ... --out docs/validation-seeds.png

Left: each student's returns over the 50 tracks, sorted, so the few tracks where a student stops
or spends long off the road stand out against the ~880 of a clean unfinished lap. Right: each
student's mean with its standard error, and the 900 target.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="agent evaluate --json files, one per student; A.json,B.json joins the "
                   "runs of one student on several track ranges")
    p.add_argument("--out", default="docs/validation-seeds.png")
    p.add_argument("--tracks", default="700,000-700,049", help="the track range, for the titles")
    p.add_argument("--label", nargs="*", default=None, help="one legend label per JSON (default: file stem)")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    names, means, ses = [], [], []
    if args.label and len(args.label) != len(args.json):
        p.error(f"--label takes one label per JSON: got {len(args.label)} labels for {len(args.json)} files")
    for i, f in enumerate(args.json):
        parts = [json.loads(Path(x).read_text()) for x in f.split(",")]
        r = np.sort(np.concatenate([np.asarray(d["returns"], dtype=float) for d in parts]))
        stalls = sum(int((np.asarray(d["longest_standstill_steps"]) > d.get("stall_steps", 50)).sum()) for d in parts)
        name = args.label[i] if args.label else Path(f.split(",")[0]).stem.replace("-val50", "")
        ax.plot(np.arange(1, len(r) + 1), r, marker=".", label=f"{name} ({stalls} stalls)")
        names.append(name)
        means.append(r.mean())
        ses.append(r.std(ddof=1) / np.sqrt(len(r)))
    ax.axhline(900, color="grey", lw=0.8, ls="--")
    ax.axhline(600, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="track, sorted by return", ylabel="episode return", ylim=(0, 1000),
           title=f"returns on tracks {args.tracks}")
    ax.legend(fontsize=8, loc="lower right")
    y = np.arange(len(names))
    bx.errorbar(means, y, xerr=ses, fmt="o", capsize=3)
    bx.axvline(900, color="grey", lw=0.8, ls="--")
    bx.set_yticks(y, names, fontsize=8)
    bx.invert_yaxis()
    bx.set(xlabel="mean return ± standard error", title=f"mean over the {len(r)} tracks")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
