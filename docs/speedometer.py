"""Draw docs/speedometer.png: what a student sees of the car's speed, with gymnasium's speed bar
and with the speedometer (``agent train --policy.dashboard speedometer``), at a few speeds.

Usage (README, "The speedometer"):

    python docs/speedometer.py --out docs/speedometer.png

The car drives track 0 with gas (the discrete action 3) until it passes each of ``--speeds``
(units/s); the frame at that step is shown twice, as the CNN reads it: the dashboard strip (rows
84-95 of 96) magnified, with the indicators a ``speed`` student cannot read blanked, and
with the speedometer that ``make_carracing(speedometer=True)`` draws.
"""

from __future__ import annotations

import argparse

import numpy as np


def frames_at(speeds: list[float], seed: int = 0, max_steps: int = 400) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(speed, plain frame, speedometer frame) at the first step past each speed, driving with gas.

    Raises:
        RuntimeError: the car did not reach a speed within ``max_steps`` steps.
    """
    from envs.carracing import draw_speedometer, make_carracing

    env = make_carracing(state_info=True)
    out, want = [], sorted(speeds)
    try:
        obs, info = env.reset(seed=seed)
        for _ in range(max_steps):
            obs, _, _, _, info = env.step(3)
            if want and info["speed"] >= want[0]:
                out.append((info["speed"], obs.copy(), draw_speedometer(obs.copy(), [info["speed"]])))
                want.pop(0)
            if not want:
                return out
    finally:
        env.close()
    raise RuntimeError(f"the car never reached {want[0]} units/s in {max_steps} steps")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speeds", type=float, nargs="+", default=[10.0, 15.0, 20.0, 25.0, 30.0, 50.0],
                   help="speeds to show, units/s")
    p.add_argument("--out", default="docs/speedometer.png", help="the figure")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent.nn.features import dashboard_mask

    shown = frames_at(args.speeds)
    speed_mask, meter_mask = dashboard_mask(96, 96, "speed"), dashboard_mask(96, 96, "speedometer")
    fig, axes = plt.subplots(len(shown), 2, figsize=(9, 0.9 * len(shown) + 0.8), squeeze=False)
    for row, (v, plain, meter) in zip(axes, shown):
        for ax, frame, mask, title in ((row[0], plain, speed_mask, "gymnasium's speed bar (--dashboard speed)"),
                                       (row[1], meter, meter_mask, "the speedometer (--dashboard speedometer)")):
            ax.imshow((frame * mask[..., None]).astype(np.uint8)[84:], interpolation="nearest", aspect="equal")
            ax.set_xticks([]), ax.set_yticks([])
            if ax is axes[0][0] or ax is axes[0][1]:
                ax.set_title(title, fontsize=9)
        row[0].set_ylabel(f"{v:.1f} units/s", rotation=0, ha="right", va="center", fontsize=9)
    fig.suptitle("what the CNN reads of the dashboard strip (rows 84-95), track 0, full gas", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
