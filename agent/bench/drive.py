"""Runner speed with and without the live overlays (``agent bench drive``): a benchmark, not a test.

Four configurations of the same headless run, each composing every frame as a window would show
it (frame, HUD and, when on, the overlays), on the same track and for the same number of steps:

1. policy only (no overlay panel),
2. + NAC traces,
3. + Grad-CAM,
4. all on (Grad-CAM and traces).

For each it prints the loop rate (FPS: act + overlays + drawing + env step) and the per-step
latency (observation to action, overlays included) as p50/p99 in milliseconds. CarRacing runs at
50 FPS, the target with everything on.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

CONFIGS = (
    ("policy only", ["--no-overlay"]),
    ("+ traces", ["--no-saliency"]),
    ("+ Grad-CAM", ["--no-traces"]),
    ("all on", []),
)


def bench_drive(policy: str = "nac.pt", steps: int = 500, warmup: int = 25, seed: int | None = None,
                rounds: int = 1, configs=CONFIGS) -> list[dict]:
    """Time the headless runner in each configuration.

    Args:
        policy: a policy file or shipped name.
        steps: timed steps per configuration and round (after ``warmup`` untimed ones).
        seed: the track (default: the first evaluation track).
        rounds: repeat all configurations this many times, interleaved, and pool the steps (fairer
            on a machine with other load).

    Returns:
        one dict per configuration: ``config``, ``fps``, ``step_p50_ms``, ``step_p99_ms``,
        ``latency_p50_ms``, ``latency_p99_ms``, ``steps``.
    """
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    from agent.loading import load_policy, resolve_policy_path
    from agent.drive.args import DEFAULT_SEED, add_drive_arguments
    from agent.drive.session import DriveSession

    path = resolve_policy_path(policy)
    pol = load_policy(path)
    parser = argparse.ArgumentParser()
    add_drive_arguments(parser)
    seed = DEFAULT_SEED if seed is None else seed
    pooled = {name: ([], []) for name, _ in configs}
    for _ in range(rounds):
        for name, flags in configs:
            args = parser.parse_args(["--headless", "--max-steps", str(steps + warmup), "--seed", str(seed), *flags])
            session = DriveSession(args, pol, path.name, headless=True, force_draw=True)
            try:
                session.play_episode(seed, 1)
            finally:
                session.close()
            pooled[name][0].extend(session.step_seconds[warmup:])
            pooled[name][1].extend(session.latency_seconds[warmup:])
    rows = []
    for name, _ in configs:
        st, lat = (np.array(x) * 1000.0 for x in pooled[name])
        rows.append({"config": name, "fps": 1000.0 / float(st.mean()), "step_p50_ms": float(np.percentile(st, 50)),
                     "step_p99_ms": float(np.percentile(st, 99)), "latency_p50_ms": float(np.percentile(lat, 50)),
                     "latency_p99_ms": float(np.percentile(lat, 99)), "steps": int(st.size)})
    return rows


def print_drive_table(rows: list[dict], target_fps: float = 50.0) -> None:
    """Print the benchmark as a Markdown table (the README's)."""
    print(f"| configuration | FPS | step p50 / p99 (ms) | latency p50 / p99 (ms) | steps |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['fps']:.1f} | {r['step_p50_ms']:.1f} / {r['step_p99_ms']:.1f} | "
              f"{r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} | {r['steps']} |")
    allon = rows[-1]
    verdict = "meets" if allon["fps"] >= target_fps else "misses"
    print(f"\n'{allon['config']}' runs at {allon['fps']:.1f} FPS: {verdict} the {target_fps:g} FPS target "
          f"(CarRacing's own rate). Load average now: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="nac.pt")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    t0 = time.perf_counter()
    print_drive_table(bench_drive(a.policy, a.steps, rounds=a.rounds))
