"""Runner speed with and without the live overlays (``agent bench drive``): a benchmark, not a test.

Four configurations of the same run, each composing every frame as a window would show it
(frame, HUD and, when on, the overlays), on the same track and for the same number of steps:

1. policy only (no overlay panel),
2. + NAC traces,
3. + saliency (the live CAM: HiResCAM at conv1 by default),
4. all on (Grad-CAM and traces),
5. all on with the env stepped in this process (``--env-worker off``), beside 4, where it steps in
   a worker process while the frame is drawn (:mod:`agent.drive.envworker`; the default whenever
   frames are drawn, so rows 1-4 have it too),

and with ``record=True`` a fifth: all on while writing the mp4 (``drive --record``). Each of
``saliency_variants`` (``METHOD@LAYER``, e.g. ``gradcam@last``) adds an "all on" row with that CAM in
place of the default, so the cost of each live method is measured side by side in one process.

Without ``window`` the run is headless (SDL's dummy driver): the frames are composed but shown
nowhere. With ``window`` every frame goes to a real pygame window, as ``drive`` shows it; with no X
display at hand (``DISPLAY`` unset) a private Xvfb is started for the run when the ``Xvfb`` program
is installed (Debian: ``apt-get install -y xvfb``), and otherwise :class:`DisplayUnavailable` says
why no window can be measured.

For each configuration it reports the loop rate (FPS: act + overlays + drawing + showing +
env step), the loop step and the observation-to-action latency as p50/p99 in milliseconds, and
the CPU time of this process per step (ms; all its threads, from ``time.process_time``: steadier
than wall time on a shared CPU; the X server's, the env worker's and ffmpeg's work is not in it;
the env worker's and ffmpeg's are given apart). CarRacing runs at 50 FPS, the target with everything on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from agent.actors.loading import load_policy, resolve_policy_path
from agent.drive.config import DEFAULT_SEED, DriveConfig
from agent.drive.session import TIMING_STEPS, DriveSession, quiet_gc

#: each configuration: its name and the :class:`agent.drive.config.DriveConfig` fields it changes
CONFIGS = (
    ("policy only", {"overlay": False}),
    ("+ traces", {"saliency": False}),
    ("+ saliency", {"traces": False}),
    ("all on", {}),
    ("all on, env in this process", {"env_worker": "off"}),
)
#: The extra configuration of ``record=True`` (its ``record`` is a temporary mp4).
RECORD_CONFIG = ("all on + --record", {"record": True})
#: Screen of the Xvfb started when there is no display (the size the README's figures were taken at).
XVFB_SCREEN = "1280x1024x24"


class DisplayUnavailable(RuntimeError):
    """No window can be opened for ``agent bench drive --window`` (the message says why and what to do)."""


@contextlib.contextmanager
def x_display(start_timeout_s: float = 10.0):
    """Make sure an X display is there for the duration: ``$DISPLAY`` if set, else a private Xvfb.

    Yields:
        a description of the display used, e.g. ":0 (DISPLAY)" or ":3 (Xvfb 1280x1024x24, started for the run)".

    Raises:
        DisplayUnavailable: SDL is told not to open windows (``SDL_VIDEODRIVER=dummy``/``offscreen``),
            or there is no display and no ``Xvfb`` program, or Xvfb did not start.
    """
    driver = os.environ.get("SDL_VIDEODRIVER", "").lower()
    if driver in ("dummy", "offscreen"):
        raise DisplayUnavailable(f"SDL_VIDEODRIVER={driver} forbids windows; unset it to measure the window path")
    if os.environ.get("DISPLAY"):
        yield f"{os.environ['DISPLAY']} (DISPLAY)"
        return
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        raise DisplayUnavailable("no X display (DISPLAY is unset) and no Xvfb to start one: install it "
                                 "(Debian/Ubuntu: apt-get install -y xvfb), set DISPLAY, or run without --window")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([xvfb, "-displayfd", str(write_fd), "-screen", "0", XVFB_SCREEN, "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    try:
        number = _read_display_number(read_fd, proc, start_timeout_s)
        os.environ["DISPLAY"] = f":{number}"
        try:
            yield f":{number} (Xvfb {XVFB_SCREEN}, started for the run)"
        finally:
            del os.environ["DISPLAY"]
    finally:
        os.close(read_fd)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_display_number(fd: int, proc: subprocess.Popen, timeout_s: float) -> int:
    """The display number Xvfb writes to ``-displayfd`` once it accepts connections."""
    import select

    data, deadline = b"", time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
        chunk = os.read(fd, 16) if ready else b""
        if not chunk:
            proc.terminate()
            err = proc.communicate(timeout=5)[1].decode(errors="replace").strip().splitlines()
            raise DisplayUnavailable(f"Xvfb did not start within {timeout_s:g} s"
                                     + (f": {err[-1]}" if err else ""))
        data += chunk
    return int(data)


def bench_drive(policy: str = "nac.pt", steps: int = 600, warmup: int = 25, seed: int | None = None,
                rounds: int = 1, configs=CONFIGS, window: bool = False, record: bool = False,
                fps_limit: float = 0.0, saliency_variants: tuple[str, ...] = ()) -> list[dict]:
    """Time the runner in each configuration.

    Args:
        policy: a policy file or shipped name.
        steps: timed steps per configuration and round (after ``warmup`` untimed ones).
        seed: the track (default: the first evaluation track).
        rounds: repeat all configurations this many times, interleaved, and pool the steps (fairer
            on a machine with other load).
        window: show every frame in a real window (see :func:`x_display`); else headless.
        record: add :data:`RECORD_CONFIG`: all on, writing an mp4 (to a temporary folder, deleted).
        fps_limit: the window's frame-rate cap, FPS (0: none, to measure what the loop can do).
        saliency_variants: ``METHOD@LAYER`` strings (methods of
            :data:`agent.drive.saliency.SALIENCY_METHODS`; layers ``convN``, ``last``, ``auto``): one more
            "all on" row each, named ``all on, METHOD@LAYER``.

    Returns:
        one dict per configuration: ``config``, ``fps``, ``step_p50_ms``, ``step_p99_ms``,
        ``latency_p50_ms``, ``latency_p99_ms``, ``cpu_ms`` (this process's CPU per step),
        ``encoder_cpu_ms`` (ffmpeg's CPU per recorded frame; NaN without recording),
        ``env_worker_cpu_ms`` (the env worker's CPU per step; NaN with the env in this process), ``steps``,
        ``window`` (the display, or "headless").

    Raises:
        DisplayUnavailable: ``window`` but no window can be opened.
        ValueError: ``steps + warmup`` over :data:`agent.drive.session.TIMING_STEPS`, or a malformed
            saliency variant.
    """
    configs = tuple(configs) + tuple(saliency_config(v) for v in saliency_variants)
    if steps + warmup > TIMING_STEPS:
        raise ValueError(f"steps + warmup must be at most {TIMING_STEPS} (the timings a drive session keeps), "
                         f"got {steps} + {warmup}; use more --rounds instead")
    if not window:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        return _bench(policy, steps, warmup, seed, rounds, configs, record, fps_limit, None)
    with x_display() as display:
        return _bench(policy, steps, warmup, seed, rounds, configs, record, fps_limit, display)


def saliency_config(variant: str) -> tuple[str, dict]:
    """``"METHOD@LAYER"`` -> the configuration ``("all on, METHOD@LAYER", DriveConfig changes)``.

    Raises:
        ValueError: no ``@``, or a method the live loop cannot run (the message lists them).
    """
    from agent.drive.saliency import check_saliency_method

    method, sep, layer = variant.partition("@")
    if not sep or not layer:
        raise ValueError(f"a saliency variant is METHOD@LAYER, e.g. gradcam@last or layercam@conv2; got {variant!r}")
    check_saliency_method(method)
    return f"all on, {method}@{layer}", {"saliency_method": method, "saliency_layer": layer}


def _bench(policy, steps, warmup, seed, rounds, configs, record, fps_limit, display) -> list[dict]:
    path = resolve_policy_path(policy)
    pol = load_policy(path)
    seed = DEFAULT_SEED if seed is None else seed
    configs = tuple(configs) + ((RECORD_CONFIG,) if record else ())
    pooled = {name: {"step": [], "lat": [], "cpu": [], "enc": [], "frames": 0, "worker": [], "worker_steps": 0}
              for name, _ in configs}
    with tempfile.TemporaryDirectory(prefix="bench-drive-") as tmp:
        for _ in range(rounds):
            for name, changes in configs:
                changes = dict(changes)
                if changes.pop("record", False):
                    changes["record"] = str(Path(tmp) / "run.mp4")  # replaced each round
                cfg = DriveConfig(max_steps=steps + warmup, track_seed=seed, fps_limit=fps_limit,
                                  headless=display is None, overwrite=True, **changes)
                session = DriveSession(cfg, pol, path.name, headless=display is None, force_draw=True)
                try:
                    if display is not None and session.window is None:
                        raise DisplayUnavailable(f"no window could be opened on {display} (see the note above)")
                    quiet_gc()  # as DriveSession.run does
                    session.play_episode(seed, 1)
                finally:
                    session.close()
                p = pooled[name]
                p["step"].extend(list(session.step_seconds)[warmup:])
                p["lat"].extend(list(session.latency_seconds)[warmup:])
                p["cpu"].extend(list(session.step_cpu_seconds)[warmup:])
                if session.writer is not None:  # ffmpeg has exited (close waits for it): its CPU is counted now
                    p["enc"].append(session.encoder_cpu_seconds)
                    p["frames"] += session.writer.frames
                if session.env_worker:  # all its steps, the untimed ones too
                    p["worker"].append(session.env_worker_cpu_seconds)
                    p["worker_steps"] += len(session.step_seconds) + 1  # + the reset
    rows = []
    for name, _ in configs:
        p = pooled[name]
        st, lat, cpu = (np.array(p[k]) * 1000.0 for k in ("step", "lat", "cpu"))
        rows.append({"config": name, "fps": 1000.0 / float(st.mean()), "step_p50_ms": float(np.percentile(st, 50)),
                     "step_p99_ms": float(np.percentile(st, 99)), "latency_p50_ms": float(np.percentile(lat, 50)),
                     "latency_p99_ms": float(np.percentile(lat, 99)), "cpu_ms": float(cpu.mean()),
                     "encoder_cpu_ms": 1000.0 * sum(p["enc"]) / p["frames"] if p["frames"] else float("nan"),
                     "env_worker_cpu_ms": (1000.0 * sum(p["worker"]) / p["worker_steps"] if p["worker_steps"]
                                           else float("nan")),
                     "steps": int(st.size), "window": display or "headless"})
    return rows


def print_drive_table(rows: list[dict], target_fps: float = 50.0) -> None:
    """Print the benchmark as a Markdown table (the README's), the verdict on the target and the load."""
    print(f"window: {rows[0].get('window', 'headless')}\n")
    print("| configuration | FPS | step p50 / p99 (ms) | latency p50 / p99 (ms) | CPU ms / step | steps |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        enc, wk = r.get("encoder_cpu_ms", float("nan")), r.get("env_worker_cpu_ms", float("nan"))
        cpu = (f"{r['cpu_ms']:.1f}" + (f" (+ env worker {wk:.1f})" if np.isfinite(wk) else "")
               + (f" (+ ffmpeg {enc:.1f})" if np.isfinite(enc) else ""))
        print(f"| {r['config']} | {r['fps']:.1f} | {r['step_p50_ms']:.1f} / {r['step_p99_ms']:.1f} | "
              f"{r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} | {cpu} | {r['steps']} |")
    allon = next((r for r in rows if r["config"] == "all on"), rows[-1])
    verdict = "meets" if allon["fps"] >= target_fps else "misses"
    print(f"\n'{allon['config']}' runs at {allon['fps']:.1f} FPS: {verdict} the {target_fps:g} FPS target "
          f"(CarRacing's own rate). Load average now: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
