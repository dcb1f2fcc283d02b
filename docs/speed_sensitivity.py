"""How much a speedometer or speed-input student's decisions lean on the speed it reads.

Usage (README, "Speed as a number"):

    python docs/speed_sensitivity.py --policy policies/nac.pt --seeds 700800 700801 --steps 800

The policy drives each track (deterministic, its own env: the speedometer drawn). At every step
the action is computed again from the same state with the newest frame's speedometer redrawn at
the speed read from it +-``--delta`` units/s (not below 0), and the share of steps whose action
changes is printed, with the most common changes (chosen action -> counterfactual action). For a
``speedometer`` student the redrawn bar also shows in its motion channels (the bar's change from
the previous frame); a ``speed-input`` student's strip is blank in both.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch


def sensitivity(policy, seed: int, steps: int, delta: float) -> dict:
    """One episode of ``policy`` on track ``seed`` for at most ``steps`` steps -> {"steps", "return",
    "changed": {+delta: share, -delta: share}, "changes": Counter of (chosen, counterfactual, d)}.

    Raises:
        ValueError: a policy that does not read the speedometer (trained with ``--policy.dashboard
            speedometer`` or ``speed-input``).
    """
    from agent.actors.loading import make_carracing_for, reads_speedometer
    from envs.carracing import draw_speedometer

    if not reads_speedometer(policy):
        raise ValueError("this policy does not read the speedometer (agent train --policy.dashboard speedometer "
                         "or speed-input)")
    names = policy.config.action_names
    env = make_carracing_for(policy)
    obs, _ = env.reset(seed=seed)
    state, total, n = None, 0.0, 0
    changed, changes = {delta: 0, -delta: 0}, Counter()
    for _ in range(steps):
        with torch.no_grad():
            speed = float(policy.features.read_speed(policy.features.preprocess(obs[None]))[0])
            y, new = policy.step(torch.as_tensor(obs)[None], state)
            a = int(y.argmax())
            for d in (delta, -delta):
                cf = draw_speedometer(obs.copy(), max(speed + d, 0.0))
                b = int(policy.step(torch.as_tensor(cf)[None], state)[0].argmax())
                if b != a:
                    changed[d] += 1
                    changes[(names[a], names[b], d)] += 1
        state, n = new, n + 1
        obs, r, term, trunc, _ = env.step(a)
        total += float(r)
        if term or trunc:
            break
    env.close()
    return {"steps": n, "return": total, "changed": {d: c / n for d, c in changed.items()}, "changes": changes}


def main(argv=None) -> int:
    from agent.nn.policy import DrivingPolicy

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="policies/nac.pt", help="a speedometer or speed-input CarRacing policy")
    p.add_argument("--seeds", type=int, nargs="+", default=[700800, 700801], help="tracks (validation, not evaluation)")
    p.add_argument("--steps", type=int, default=800, help="steps per track")
    p.add_argument("--delta", type=float, default=5.0, help="units/s added and taken away")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    policy = DrivingPolicy.load(args.policy).eval()
    for seed in args.seeds:
        r = sensitivity(policy, seed, args.steps, args.delta)
        top = ", ".join(f"{a}->{b} ({d:+g}) {c}" for (a, b, d), c in r["changes"].most_common(4))
        print(f"{args.policy} track {seed}: {r['steps']} steps, return {r['return']:.1f}; action changed at "
              f"+{args.delta:g} units/s on {100 * r['changed'][args.delta]:.1f} %, at -{args.delta:g} on "
              f"{100 * r['changed'][-args.delta]:.1f} % of the steps; {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
