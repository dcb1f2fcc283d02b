"""Draw docs/gradcam-dashboard.png: where two policies' Grad-CAM goes, on average over a lap.

Usage (the dumps come from ``drive --dump-traces``, which stores each step's Grad-CAM map as ``cam``):

    drive --policy OLD.pt --headless --max-steps 800 --track-seed 1000000 --dump-traces old.npz
    drive --policy NEW.pt --headless --max-steps 800 --track-seed 1000000 --dump-traces new.npz
    python docs/gradcam_dashboard.py "visible dashboard" old.npz "dashboard masked" new.npz --out docs/gradcam-dashboard.png

Each panel is the mean Grad-CAM map over the steps of its dump(s), with CarRacing's dashboard
strip (the bottom 12 rows) outlined and its share of the mass
(:func:`agent.drive.saliency.bottom_share`) in the title.
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pairs", nargs="+", help="LABEL DUMP.npz[,DUMP2.npz] pairs")
    p.add_argument("--out", default="docs/gradcam-dashboard.png")
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        p.error("give LABEL DUMP pairs")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from agent.drive.saliency import DASHBOARD_ROWS, bottom_share

    pairs = list(zip(args.pairs[::2], args.pairs[1::2]))
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.6 * len(pairs), 3.9))
    for ax, (label, files) in zip(np.atleast_1d(axes), pairs):
        cams = []
        for f in files.split(","):
            with np.load(f, allow_pickle=False) as d:
                c = d["cam"]
            cams.append(c[np.isfinite(c).all(axis=(1, 2))])
        cam = np.concatenate(cams)
        mean = cam.mean(0)
        h, w = mean.shape
        ax.imshow(mean, cmap="jet", vmin=0, vmax=max(float(mean.max()), 1e-6))
        ax.add_patch(Rectangle((-0.5, h - DASHBOARD_ROWS - 0.5), w, DASHBOARD_ROWS, fill=False, ec="white", lw=1.5,
                               ls="--"))
        ax.set_title(f"{label}\ndashboard share {100 * bottom_share(cam):.1f} % ({len(cam)} steps)", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("mean Grad-CAM over a lap (dashed: the dashboard strip, 12.5 % of the frame)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
