"""Latency of the Udacity simulator bridge: telemetry in -> steer out, over loopback.

What is measured
----------------
A :class:`envs.udacity.fake.FakeSimulator` (a raw websocket client speaking the simulator's
exact protocol) plays the simulator in Autonomous mode: it sends a telemetry frame (a 320x160
JPEG, base64, about 7 kB) and, as soon as the reply arrives, the next one. For each frame the
round trip is the time from just before the fake sends it to the moment its reader thread has
the ``steer`` reply: websocket framing both ways, engine.io/socket.io decoding, JPEG decoding
and validation, the hand-over to the env's thread, the ``policy_fn`` call (if any), the
throttle controller and the ``steer`` encoding. It runs in one process on 127.0.0.1 with
``time.perf_counter`` on both ends, so clocks agree. The real simulator adds its own frame time
(Unity renders and encodes the camera image), which is not the bridge's.

``policy_fn(frame, info) -> steering`` runs in the env loop between ``step`` calls, as a live
runner would call a policy and draw overlays, so its cost lands inside the round trip.

Entry points: :func:`bench_bridge` (returns one row), :func:`print_bridge_table` (prints rows),
and ``agent bench bridge`` (:class:`agent.bench.config.BenchBridge`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.actors.loading import load_policy
from agent.actors.rollout import PolicyActor
from agent.drive.explain import Overlays
from agent.drive.hud import Renderer, StepView
from agent.nn.policy import DrivingPolicy, default_config
from envs.udacity.env import UdacityEnv
from envs.udacity.fake import FakeSimulator, synthetic_road_frame

ROW_KEYS = ("label", "n", "warmup", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "steps_per_s",
            "frame_kb", "load1", "cpus")


def bench_bridge(n: int = 1000, policy_fn: Callable[[np.ndarray, dict], float] | None = None, warmup: int = 50,
                 label: str | None = None, n_frames: int = 8, timeout: float = 10.0) -> dict[str, Any]:
    """Drive the bridge with the fake simulator for ``warmup + n`` frames and time the last ``n``.

    Args:
        n: timed round trips.
        policy_fn: called as ``policy_fn(frame, info)`` before each ``step``; returns the
            normalised steering. None sends 0.0 (the bridge alone).
        warmup: round trips run first and not timed (imports, allocator, caches).
        label: the row's name (default: "bridge only" or the callable's name).
        n_frames: distinct synthetic road frames the fake cycles through.
        timeout: seconds to wait for the connection and for each frame.

    Returns:
        A row: label, n, warmup, p50/p90/p99/max/mean round trip in ms, steps_per_s (env steps
        per second over the timed part), frame_kb (mean JPEG size), load1 (1-minute load average
        when it started) and cpus.
    """
    if n < 1 or warmup < 0:
        raise ValueError("n must be >= 1 and warmup >= 0")
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    frames = [synthetic_road_frame(i, float(np.sin(i / 3))) for i in range(n_frames)]
    env = UdacityEnv(port=0, connect_timeout=timeout, step_timeout=timeout)
    try:
        port = env.start()
        with FakeSimulator(port, autoreply=True, frames=frames, timeout=timeout) as sim:
            obs, info = env.reset()
            t_start = time.perf_counter()
            for i in range(warmup + n):
                if i == warmup:
                    t_start = time.perf_counter()
                steering = 0.0 if policy_fn is None else float(policy_fn(obs, info))
                obs, _, _, truncated, info = env.step(steering)
                if truncated:
                    raise RuntimeError(f"the fake simulator stopped answering ({info.get('truncated_reason')})")
            elapsed = time.perf_counter() - t_start
            total = warmup + n
            if not sim.wait_for(lambda c: c["steer"] >= total, timeout):
                raise RuntimeError(f"only {sim.counts['steer']} of {total} steer replies arrived")
            lat = np.asarray(sim.round_trips_ms[warmup:total], dtype=np.float64)
            frame_kb = float(np.mean([len(b) * 3 / 4 for b in sim.frames_b64])) / 1024
    finally:
        env.close()
    name = label or ("bridge only" if policy_fn is None else getattr(policy_fn, "__name__", "policy"))
    return {
        "label": name, "n": n, "warmup": warmup,
        "p50_ms": float(np.percentile(lat, 50)), "p90_ms": float(np.percentile(lat, 90)),
        "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max()), "mean_ms": float(lat.mean()),
        "steps_per_s": n / elapsed if elapsed > 0 else float("inf"), "frame_kb": frame_kb,
        "load1": load1, "cpus": os.cpu_count(),
    }


def print_bridge_table(rows: list[dict], file=None) -> None:
    """Print rows of :func:`bench_bridge`, one per line."""
    file = file or sys.stdout
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p("Udacity bridge round trip (fake simulator sends telemetry -> receives steer), loopback, one process; "
      "time.perf_counter")
    loads = [r["load1"] for r in rows if r.get("load1") is not None]
    ncpu = max([r.get("cpus") or 1 for r in rows] or [os.cpu_count() or 1])
    if loads and max(loads) > 0.5 * ncpu:
        p(f"WARNING: 1-min load average {max(loads):.1f} on {ncpu} CPUs when the benchmark started; "
          f"the tail (p99, max) is inflated by waiting for a core")
    cols = [("policy", 24), ("n", 6), ("p50 ms", 7), ("p90 ms", 7), ("p99 ms", 7), ("max ms", 7), ("mean ms", 7),
            ("steps/s", 8), ("frame kB", 8)]
    p(" | ".join(name.rjust(w) for name, w in cols))
    p("-+-".join("-" * w for _, w in cols))
    for r in rows:
        vals = [str(r["label"])[:24], str(r["n"]), f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}",
                f"{r['max_ms']:.2f}", f"{r['mean_ms']:.2f}", f"{r['steps_per_s']:.0f}", f"{r['frame_kb']:.1f}"]
        p(" | ".join(v.rjust(w) for v, (_, w) in zip(vals, cols)))


def runner_policy_fn(policy, overlays: bool) -> Callable[[np.ndarray, dict], float]:
    """What ``drive --env udacity`` does per frame, as a ``policy_fn``: the policy's streaming step
    (with the frame's arrival time as the NAC time), and with ``overlays`` also Grad-CAM on the
    newest frame, the NAC traces and the composition of the whole view (frame, HUD, panel)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

    driver = PolicyActor(policy, label="policy")
    renderer = ov = None
    if overlays:
        renderer = Renderer((320, 160), scale=2, policy_label="bench", steering=True, speed_unit="mph")
        ov = Overlays(policy, driver, renderer, saliency=True, traces=True, class_names=("straight", "left", "right"))

    def step(frame: np.ndarray, info: dict) -> float:
        d = driver.act(frame, None, info)
        steer = float(np.asarray(d.action).reshape(-1)[0])
        if ov is not None:
            extras: dict = {}
            status = ov.explain(frame, d, extras)
            renderer.compose(StepView(frame=frame, extras=extras, status=status, steering=steer))
        return steer

    step.__name__ = "policy + overlays" if overlays else "policy"
    step.close = ov.close if ov is not None else (lambda: None)  # type: ignore[attr-defined]
    return step


def bench_bridge_policy(policy_path: str | None, n: int, warmup: int) -> list[dict]:
    """Rows: bridge only; the Udacity policy; the policy with every overlay (one torch thread).

    ``policy_path`` None (or a missing shipped file) times a freshly initialised policy of the
    shipped architecture: the cost does not depend on the weights.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try:
            policy = load_policy(policy_path) if policy_path else DrivingPolicy(default_config("udacity")).eval()
        except FileNotFoundError:
            policy = DrivingPolicy(default_config("udacity")).eval()
        rows = [bench_bridge(n, None, warmup)]
        for overlays in (False, True):
            fn = runner_policy_fn(policy, overlays)
            try:
                rows.append(bench_bridge(n, fn, warmup, label=fn.__name__))
            finally:
                fn.close()
        return rows
    finally:
        torch.set_num_threads(threads)
