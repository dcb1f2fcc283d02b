"""A soak run of the live runner (``agent bench soak``): does ``drive`` keep its memory flat?

It drives CarRacing the way ``drive --headless --record RUN.mp4 --dump-traces RUN.h5`` does, with
the shipped policy and every overlay on (Grad-CAM, the NAC trace panel, the composed view written
to the mp4, every step's traces and Grad-CAM map streamed to the trace file), for ``steps`` steps
in one :class:`agent.drive.session.DriveSession`: episodes of up to 1,000 steps (the env's limit)
on tracks ``track_seed``, ``track_seed`` + 1, ..., until ``steps`` steps have run (the last episode
is finished, so a few more may run). It samples this process's resident memory (RSS) at the start
(the session built, no step run), after every episode and at the end (the video and the trace
file closed), and prints them with the machine, the device and the versions.

Issue 38 found ``--dump-traces`` buffering every step in memory (471-745 MB over 2,448 steps) and
``--record`` growing from 599 to 635 MB over 3 episodes; this is the check that both stay flat.

RSS comes from psutil when it is installed, else from ``/proc/self/status`` (VmRSS, Linux), else
from ``resource.getrusage`` (the peak RSS, not the current one: the report says which). The env
worker process (:mod:`agent.drive.envworker`), when there is one, is not counted: it holds only the
simulator.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from agent.actors.loading import load_policy, resolve_policy_path
from agent.drive.config import DEFAULT_SEED, DriveConfig
from agent.drive.session import DriveSession, quiet_gc
from agent.train.config import torch_device
from envs.carracing import EPISODE_STEPS

#: The files a soak run writes in its folder.
VIDEO_NAME, TRACES_NAME = "soak.mp4", "soak.h5"


def rss_bytes() -> tuple[int, str]:
    """This process's resident set size in bytes, and where it was read.

    Returns:
        (bytes, source): source is ``"psutil"``, ``"/proc/self/status VmRSS"`` or
        ``"resource.getrusage ru_maxrss (peak, not current)"``.
    """
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.Process().memory_info().rss), "psutil"
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024, "/proc/self/status VmRSS"
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(peak if sys.platform == "darwin" else peak * 1024), "resource.getrusage ru_maxrss (peak, not current)"


def _versions() -> dict[str, str]:
    import gymnasium
    import h5py
    import numpy
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "gymnasium": gymnasium.__version__, "h5py": h5py.__version__}


def _mb(n: int) -> float:
    return n / 2**20


def bench_soak(policy: str = "nac.pt", steps: int = 20_000, track_seed: int = DEFAULT_SEED, out: str | None = None,
               overwrite: bool = False, device: str = "auto", env_worker: str = "auto") -> dict:
    """Drive ``steps`` steps with ``--record`` and ``--dump-traces`` and every overlay; sample the RSS.

    Args:
        policy: a CarRacing policy file or shipped name (every overlay needs a NAC policy with a CNN).
        steps: steps to run at least (whole episodes of up to 1,000 steps).
        track_seed: the first track.
        out: keep the video and the trace file in this folder (:data:`VIDEO_NAME`, :data:`TRACES_NAME`);
            None: a temporary folder, removed at the end.
        overwrite: replace those files in ``out``.
        device: the policy's torch device (``auto``: cuda when there is one).
        env_worker: ``drive --env-worker`` (auto: a worker process on 2+ CPUs, as ``drive`` does).

    Returns:
        the report: ``policy``, ``steps``, ``episodes``, ``samples`` (a list of ``{"steps", "episode",
        "rss_mb"}``: the start, each episode's end, the end), ``rss_start_mb``, ``rss_end_mb``,
        ``rss_after_first_episode_mb``, ``rss_peak_mb`` (of the samples), ``rss_source``,
        ``video_mb``, ``traces_mb``, ``wall_s``, ``steps_per_s``, ``device``, ``env_worker``,
        ``machine``, ``cpus``, ``versions``.

    Raises:
        ValueError: ``steps`` < 1; FileExistsError: a file in ``out`` exists and not ``overwrite``;
        FileNotFoundError: no such policy.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    path = resolve_policy_path(policy)
    dev = torch_device(device)
    pol = load_policy(path, dev)
    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="bench-soak-")
        folder = Path(tmp)
    else:
        folder = Path(out)
        for name in (VIDEO_NAME, TRACES_NAME):
            if (folder / name).exists() and not overwrite:
                raise FileExistsError(f"{folder / name} already exists; choose another --out or pass --overwrite")
        folder.mkdir(parents=True, exist_ok=True)
    video, traces = folder / VIDEO_NAME, folder / TRACES_NAME
    try:
        cfg = DriveConfig(policy=str(path), headless=True, record=str(video), dump_traces=str(traces),
                          overwrite=True, track_seed=track_seed, max_steps=min(steps, EPISODE_STEPS),
                          device=device, env_worker=env_worker).check()
        session = DriveSession(cfg, pol, path.name, headless=True)
        samples = []
        source = ""

        def sample(done: int, episode: str) -> None:
            nonlocal source
            n, source = rss_bytes()
            samples.append({"steps": done, "episode": episode, "rss_mb": round(_mb(n), 1)})

        done = episodes = 0
        t0 = time.perf_counter()
        try:
            quiet_gc()  # as DriveSession.run does
            sample(0, "start")
            while done < steps:
                _, _, n = session.play_episode(track_seed + episodes, episodes + 1)
                episodes += 1
                done += n
                sample(done, str(episodes))
        finally:
            session.close()
        wall = time.perf_counter() - t0
        sample(done, "end")
        rss = [s["rss_mb"] for s in samples]
        return {"policy": path.name, "steps": done, "episodes": episodes, "samples": samples,
                "rss_start_mb": rss[0], "rss_end_mb": rss[-1],
                "rss_after_first_episode_mb": rss[1], "rss_peak_mb": max(rss), "rss_source": source,
                "video_mb": round(_mb(video.stat().st_size), 1) if video.exists() else 0.0,
                "traces_mb": round(_mb(traces.stat().st_size), 1) if traces.exists() else 0.0,
                "wall_s": round(wall, 1), "steps_per_s": round(done / max(wall, 1e-9), 1), "device": dev,
                "env_worker": bool(session.env_worker), "machine": f"{platform.platform()} {platform.machine()}",
                "cpus": os.cpu_count(), "versions": _versions(),
                "folder": None if tmp is not None else str(folder)}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def print_soak_report(r: dict) -> None:
    """Print a soak report: what ran, on what, the RSS table (Markdown) and the RSS at start and end."""
    v = r["versions"]
    print(f"soak: drive --headless --record --dump-traces, {r['policy']}, every overlay on: {r['steps']} steps in "
          f"{r['episodes']} episodes, {r['wall_s']:.1f} s ({r['steps_per_s']:.1f} steps/s)")
    print(f"machine: {r['machine']}, {r['cpus']} CPUs; device {r['device']}; env worker "
          f"{'on' if r['env_worker'] else 'off'}; " + ", ".join(f"{k} {x}" for k, x in v.items()))
    print(f"RSS of this process from {r['rss_source']}\n")
    print("| after | steps | RSS (MB) |")
    print("|---|---|---|")
    for s in r["samples"]:
        what = {"start": "start (no step run)", "end": "end (video and traces closed)"}.get(s["episode"],
                                                                                            f"episode {s['episode']}")
        print(f"| {what} | {s['steps']} | {s['rss_mb']:.1f} |")
    grow = r["rss_end_mb"] - r["rss_after_first_episode_mb"]
    print(f"\nRSS start {r['rss_start_mb']:.1f} MB, end {r['rss_end_mb']:.1f} MB, peak {r['rss_peak_mb']:.1f} MB; "
          f"from the end of the first episode to the end: {grow:+.1f} MB")
    where = f"in {r['folder']}" if r.get("folder") else "in a temporary folder, removed"
    print(f"wrote {r['video_mb']:.1f} MB of video and {r['traces_mb']:.1f} MB of traces ({where})")


__all__ = ["TRACES_NAME", "VIDEO_NAME", "bench_soak", "print_soak_report", "rss_bytes"]
