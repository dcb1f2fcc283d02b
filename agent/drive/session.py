"""The live runner behind ``drive``: one run (:class:`DriveSession`) and its loop, and :func:`run_drive`.

``drive --env carracing --policy nac.pt [--episodes N] [--track-seed S] [--max-steps M] [--headless]
[--record out.mp4]`` loads the policy once and drives episodes on tracks S, S+1, ... For every
step it shows the 96x96 frame the policy sees (scaled up, nearest neighbour), a HUD with the
action chosen on that frame, the NAC policy's action probabilities (the expert has none), the
car speed, the return so far, the step and the frame rate, and a right-hand panel kept free for
overlays (Grad-CAM saliency, NAC neuron traces) that plug into
:attr:`agent.drive.hud.Renderer.panels`.

Everything is drawn onto one off-screen ``pygame.Surface`` (:meth:`agent.drive.hud.Renderer.compose`);
a window (:mod:`agent.drive.window`) shows it, ``--record`` writes it to an mp4
(:mod:`agent.drive.video`; libx264, 50 FPS, the env's own rate). With ``--headless``, or when no
display is available, no window is opened (``SDL_VIDEODRIVER=dummy``) and the run is never
rate-limited; without ``--record`` a headless run skips drawing entirely.

``drive --env udacity --replay DIR`` plays a recording as the simulator through the bridge and
scores the policy's steering against the driver's (:mod:`agent.drive.replay`).

The options are :class:`agent.drive.config.DriveConfig`; the policy acts through :mod:`agent.actors.rollout`
(one actor interface) and is explained by :mod:`agent.drive.explain`. Heavy modules (pygame, torch, imageio, gymnasium) are
imported lazily.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

from agent.actors.loading import is_continuous, load_policy, make_actor, make_carracing_for, resolve_policy_path
from agent.actors.rollout import StallMeter, all_wheels_off_road, tiles_missed
from agent.actors.vector import envs_for
from agent.drive.config import ENV_FPS, DriveConfig
from agent.drive.envworker import EnvWorker, use_env_worker
from agent.drive.explain import Overlays
from agent.drive.hud import STEERING_CLASSES, Renderer, StepView
from agent.drive.replay import (ReplayClock, ReplayError, ReplayRecording, ReplayScore, final_scores, load_replay,
                                skipped_text, summary_lines)
from agent.drive.teacher import Teacher
from agent.drive.traces import TraceWriter, action_number
from agent.drive.video import VideoWriter
from agent.drive.window import HELP_TEXT, Window, display_unavailable_reason
from agent.experts.policy import ExpertPolicy
from envs.carracing import ACTION_NAMES, EPISODE_STEPS, car_speed, make_carracing
from agent.train.config import torch_device
from envs.udacity.env import UdacityEnv

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
#: Loop steps whose timings a session keeps (:attr:`DriveSession.step_seconds`, ...): the last 20,000
#: (400 s at 50 FPS), so a drive with no natural end (the Udacity simulator) keeps its memory flat.
TIMING_STEPS = 20_000


def _err(msg: str) -> None:
    print(f"drive: error: {msg}", file=sys.stderr)


def run_drive(cfg: DriveConfig) -> int:
    """Drive ``cfg.episodes`` episodes with ``cfg.policy``; print per-episode and mean returns.

    ``cfg`` is checked already (:func:`agent.drive.config.parse_drive_args`). Returns the exit code:
    0 (done, or the window was closed / Escape / Q), 2 (a policy file that cannot be driven: a
    message on stderr), 130 (Ctrl-C; the video and the traces so far are still written).
    """
    replay = None
    if cfg.replay is not None:  # the recording first: a wrong folder is reported before the policy loads
        try:
            replay = load_replay(cfg.replay)
        except ReplayError as exc:
            _err(str(exc))
            return EXIT_ERROR
        if replay.bad_rows:
            print(f"drive: note: {skipped_text(replay)}", file=sys.stderr)
    try:
        path = resolve_policy_path(cfg.policy)
        policy = load_policy(path, torch_device(cfg.device))
    except (FileNotFoundError, ValueError) as exc:
        _err(str(exc))
        return EXIT_ERROR

    headless = bool(cfg.headless)
    if not headless:
        reason = display_unavailable_reason()
        if reason:
            print(f"drive: note: {reason}; running headless (no window)", file=sys.stderr)
            headless = True
    if headless:
        import pygame

        if not pygame.display.get_init():
            os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window, even if something inits the display
    try:
        session = DriveSession(cfg, policy, path.name, headless=headless, replay=replay)
    except (ValueError, OSError) as exc:  # a policy for another simulator; the port is taken
        _err(str(exc))
        return EXIT_ERROR
    try:
        url = session.env.unwrapped.url if cfg.env == "udacity" else ""
        where = (f"tracks {cfg.track_seed}..{cfg.track_seed + cfg.episodes - 1}" if cfg.env == "carracing" else
                 f"serving {url}: start the simulator and choose Autonomous mode" if replay is None else
                 f"replaying {replay.folder} ({len(replay)} frames) as the simulator on {url}")
        print(f"policy {path} ({session.driver.label}); env {cfg.env}; {where}"
              f"{'; headless' if session.window is None else ''}"
              f"{'; env in a worker process' if session.env_worker else ''}"
              f"{f'; teacher {session.teacher.name}' if session.teacher else ''}"
              f"{f'; recording {cfg.record}' if session.writer else ''}", flush=True)
        return session.run()
    except TimeoutError as exc:  # no simulator connected
        _err(str(exc))
        return EXIT_ERROR
    finally:
        session.close()


def stall_text(meter: StallMeter, cut_short: bool = False) -> str:
    """The end-of-episode stall figures as printed by ``drive``: "  longest standstill L steps  off-road N
    steps  tiles missed M  longest crawl C steps  slow S steps" (each left out where the env does not
    report it, e.g. Udacity; a crawl is below :data:`agent.actors.rollout.CRAWL_METRIC_SPEED`, 5 units/s; slow
    steps are below :data:`agent.actors.rollout.SLOW_SPEED`, 10 units/s, after the car first reached it; a
    lap ends only once no tile is missed, :func:`agent.actors.rollout.tiles_missed`). With ``cut_short``
    (the episode was stopped, restarted or cut by ``--max-steps`` before the env's own end) the tiles
    not reached yet say nothing about the lap, so "tiles missed" is replaced by "lap cut short"."""
    out = ""
    if meter.longest_standstill is not None:
        out += f"  longest standstill {meter.longest_standstill:4d} steps"
    if meter.off_road_steps is not None:
        out += f"  off-road {meter.off_road_steps:4d} steps"
    if meter.tiles_missed is not None:
        out += "  lap cut short" if cut_short else f"  tiles missed {meter.tiles_missed:3d}"
    if meter.longest_crawl is not None:
        out += f"  longest crawl {meter.longest_crawl:4d} steps"
    if meter.slow_steps is not None:
        out += f"  slow {meter.slow_steps:4d} steps"
    return out


def _children_cpu(before) -> float:
    """CPU seconds (user + system) of the child processes waited for since ``before`` (``os.times()``)."""
    after = os.times()
    return after.children_user + after.children_system - before.children_user - before.children_system


def quiet_gc() -> None:
    """Keep Python's garbage collector from pausing the loop: collect once, then move every object
    alive now (torch, gymnasium, pygame, the policy: a few hundred thousand) into the permanent
    generation (``gc.freeze``), so later collections traverse only what the loop itself makes.

    Without it a full (generation 2) collection traversed all of them, 120-200 ms at once on this
    2-core machine, once or twice in the first seconds of a drive: one such frame cost a 50 FPS
    window about 4 frames of its budget (49.2 instead of 49.9 mean FPS over 600 steps). The frozen
    objects are not freed until :meth:`DriveSession.close` calls ``gc.unfreeze``; reference counting
    still frees everything that is not in a cycle.
    """
    gc.collect()
    gc.freeze()


def _is_expert(policy) -> bool:
    return isinstance(policy, ExpertPolicy)


def _throttle_of(action) -> float | None:
    """The throttle of a (steering, throttle) action (CarRacing's continuous configuration), else None."""
    a = np.asarray(action).reshape(-1)
    return float(a[1]) if a.size == 2 else None


class DriveSession:
    """One ``drive`` run: env, policy driver, overlays, renderer, window and video, and the loop.

    Args:
        cfg: the ``drive`` options (:class:`agent.drive.config.DriveConfig`).
        policy: the loaded policy; ``name`` labels it.
        headless: no window.
        force_draw: compose every frame even without a window or video (the FPS benchmark).

    Attributes:
        step_seconds: wall time of each loop step (act + overlays + drawing + env step), seconds; like
            ``step_cpu_seconds`` and ``latency_seconds``, a deque of the last :data:`TIMING_STEPS` steps.
        step_cpu_seconds: CPU time of this process (all its threads) in each loop step, seconds
            (``time.process_time``; steadier than wall time on a shared CPU; an X server's,
            ffmpeg's or the env worker's work is not in it).
        env_worker: the env steps in a worker process (:mod:`agent.drive.envworker`);
            ``env_worker_reason`` says why it does or does not.
        episode_fps: the current (or last) episode's mean loop rate: steps per second of wall time
            from the start of its first step to the end of its last (the track's generation at reset is
            not counted; a pause is).
        encoder_cpu_seconds, env_worker_cpu_seconds: after :meth:`close`, the CPU seconds ffmpeg
            (``--record``) and the env worker used over the whole run (NaN without them).
        latency_seconds: observation-to-action time of each step, seconds: until the action is
            sent to the env worker (the policy's step), or with the env in this process until the
            env is stepped (the policy and the overlays).
        stalls: the "no stalls" figures of the current (or last) episode (:class:`agent.actors.rollout.StallMeter`):
            the longest standstill and the steps with all four wheels off the road.
        teacher: with ``--teacher.expert``, the expert that labels every step and counts the current (or
            last) episode's agreement (:class:`agent.drive.teacher.Teacher`); else None.
    """

    def __init__(self, cfg: DriveConfig, policy, name: str, headless: bool, force_draw: bool = False,
                 replay: ReplayRecording | None = None):
        import torch

        self.cfg = cfg
        if replay is not None and cfg.env != "udacity":
            raise ValueError("a replay plays a Udacity simulator recording; drive it with --env udacity")
        #: ``--replay``: the recording played as the simulator, the policy's steering per frame and the
        #: running scores (:class:`agent.drive.replay.ReplayScore`), and the simulator playing it
        #: (:class:`envs.udacity.replay.ReplaySimulator`, connected by :meth:`run`); else None.
        self.replay = replay
        self.replay_score = ReplayScore(replay) if replay is not None else None
        self.replay_sim = None
        policy_env = getattr(getattr(policy, "config", None), "env", "carracing")
        if policy_env != cfg.env:
            raise ValueError(f"{name} is a {policy_env} policy; drive it with --env {policy_env} "
                             f"(or choose a {cfg.env} policy)")
        self.driver = make_actor(policy, label=name)
        #: the expert that labels every step (``--teacher.expert``; :class:`agent.drive.teacher.Teacher`), or None
        self.teacher = None
        if cfg.teacher.expert:
            self.teacher = Teacher.load(cfg.teacher.expert, is_continuous(policy), cfg.teacher.rules)
        overlay = cfg.overlay
        draw = force_draw or not headless or cfg.record is not None
        self.env_worker, self.env_worker_reason = use_env_worker(
            cfg.env_worker, cfg.env, _is_expert(policy) or self.teacher is not None, draw, os.cpu_count())
        names = tuple(getattr(getattr(policy, "config", None), "action_names", ACTION_NAMES))
        discrete = not is_continuous(policy)  # continuous: a steering gauge and throttle, no probabilities
        self.class_names = names if discrete else STEERING_CLASSES
        #: ``--dump-traces``'s streaming writer (:class:`agent.drive.traces.TraceWriter`; it makes its file
        #: at the first recorded step), or None. Made before the env: a refused path leaves nothing open.
        self.trace_writer = None
        if cfg.dump_traces is not None:
            self.trace_writer = TraceWriter(
                cfg.dump_traces, action_names=tuple(getattr(getattr(policy, "config", None), "action_names", ())),
                class_names=self.class_names, policy=self.driver.label, env=cfg.env, overwrite=cfg.overwrite,
                teacher=self.teacher.name if self.teacher is not None else "")
        self.env = self._make_env(cfg, policy, self.env_worker, replay)
        self.env_fps = int(self.env.metadata.get("render_fps", ENV_FPS))
        obs_shape = self.env.observation_space.shape  # (H, W, C)
        scale = cfg.frame_scale
        # One frame at a time: intra-op threads only add synchronisation (with 2 threads on a busy 2-core
        # machine a NAC step took 40 ms instead of 1.5 ms), so act single-threaded; restored at close().
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.window = self.writer = self.renderer = None
        if draw:
            self.renderer = Renderer((obs_shape[1], obs_shape[0]), scale=scale, action_names=names,
                                     policy_label=self.driver.label, show_probs=self.driver.has_probs,
                                     panel_width=420 if overlay else 0,
                                     help_text=HELP_TEXT if not headless else "", steering=not discrete,
                                     speed_unit="mph" if cfg.env == "udacity" else "",
                                     steering_degrees=25.0 if cfg.env == "udacity" else None)
        if not headless:
            try:
                self.window = Window(self.renderer.size, f"drive - {self.driver.label}", cfg.fps_limit)
            except Exception as exc:  # pygame.error, or a broken video driver
                print(f"drive: note: cannot open a window ({exc}); running headless", file=sys.stderr)
                os.environ["SDL_VIDEODRIVER"] = "dummy"
                if cfg.record is None and not force_draw:
                    self.renderer = None  # nothing would show the drawing
        if cfg.record is not None:
            self.writer = VideoWriter(Path(cfg.record), self.renderer.size, fps=self.env_fps)
        self.overlays = Overlays(policy, self.driver, self.renderer, saliency=overlay and cfg.saliency,
                                 traces=overlay and cfg.traces, dump=cfg.dump_traces is not None,
                                 opacity=cfg.cam_opacity, class_names=self.class_names, recorder=self.trace_writer,
                                 saliency_method=cfg.saliency_method, saliency_layer=cfg.saliency_layer)
        for what, why in self.overlays.reasons.items():
            print(f"drive: note: {what} overlay off: {why}", file=sys.stderr)
        self.paused = self.single_step = self.restart_requested = False
        if self.window is not None:
            pg = self.window.pygame
            self.window.keys.update({
                pg.K_p: self.toggle_pause, pg.K_SPACE: self.toggle_pause, pg.K_n: self.request_step,
                pg.K_PERIOD: self.request_step, pg.K_s: self.overlays.toggle_saliency,
                pg.K_t: self.overlays.toggle_traces, pg.K_h: self.overlays.next_head,
                pg.K_LEFTBRACKET: lambda: self.overlays.adjust_opacity(-0.1),
                pg.K_RIGHTBRACKET: lambda: self.overlays.adjust_opacity(+0.1),
                pg.K_r: self.request_restart})
        self.episode_fps = 0.0
        self.encoder_cpu_seconds = self.env_worker_cpu_seconds = float("nan")
        self.step_seconds: deque[float] = deque(maxlen=TIMING_STEPS)
        self.step_cpu_seconds: deque[float] = deque(maxlen=TIMING_STEPS)
        self.latency_seconds: deque[float] = deque(maxlen=TIMING_STEPS)
        self.stalls = StallMeter()
        self._sigint = False  # set by run()'s Ctrl-C handler

    @staticmethod
    def _make_env(cfg: DriveConfig, policy=None, worker: bool = False, replay: ReplayRecording | None = None):
        """CarRacing (one episode per track seed; the continuous configuration for a policy with
        continuous actions, :func:`agent.actors.loading.make_carracing_for`), in a worker process with
        ``worker`` (:class:`agent.drive.envworker.EnvWorker`), or the Udacity bridge (started at
        once, so its address is known; an episode lasts until the simulator disconnects or --max-steps).
        With ``replay`` the bridge listens on a free loopback port and gives each frame its capture
        time (:class:`agent.drive.replay.ReplayClock`)."""
        if cfg.env == "udacity":
            from gymnasium.wrappers import TimeLimit

            ud = cfg.udacity
            host, port = (ud.host, ud.port) if replay is None else ("127.0.0.1", 0)
            env = UdacityEnv(host=host, port=port, target_speed=ud.target_speed, connect_timeout=ud.connect_timeout)
            env.start()
            if replay is not None:
                env = ReplayClock(env, replay)
            return TimeLimit(env, cfg.max_steps) if cfg.max_steps else env

        if worker:
            return EnvWorker(envs_for(policy, 1, max_episode_steps=cfg.max_steps or EPISODE_STEPS))

        if policy is None:
            return make_carracing(max_episode_steps=cfg.max_steps or EPISODE_STEPS)
        return make_carracing_for(policy, max_episode_steps=cfg.max_steps or EPISODE_STEPS)

    def _speed_of(self, info: dict) -> float:
        """The speed shown in the HUD: mph from the Udacity bridge, else CarRacing's speed in
        simulator units per second (from ``info`` when the env runs in the worker)."""
        if "speed_mph" in info:
            return float(info["speed_mph"])
        if self.env_worker:
            return float(info.get("speed", 0.0))
        return float(getattr(self.env.unwrapped, "speed", 0.0))

    # ------------------------------------------------------------------ keys
    def toggle_pause(self) -> None:
        self.paused = not self.paused

    def request_step(self) -> None:
        """Advance one step; pauses the run first if it was running."""
        if self.paused:
            self.single_step = True
        else:
            self.paused = True

    def request_restart(self) -> None:
        self.restart_requested = True

    @property
    def _quit(self) -> bool:
        return self.window is not None and self.window.quit_requested

    # ------------------------------------------------------------------ loop
    def play_episode(self, seed: int, episode: int) -> tuple[str, float, int]:
        """Drive one episode on track ``seed``; returns (how it ended, return, steps).

        Ends with "done" (terminated or truncated), "quit" (window closed, Escape, Q) or "restart" (R).
        """
        env, driver, renderer, window, ov = self.env, self.driver, self.renderer, self.window, self.overlays
        obs, info = env.reset(seed=int(seed))
        driver.reset()
        ov.new_episode()
        self.stalls.reset()
        teacher = self.teacher
        if teacher is not None:
            teacher.reset()
        ep_return, steps = 0.0, 0
        if window is not None and window.pacer is not None:
            window.pacer.start()  # the episode's frames are due from now (the reset above is not paced)
        ticks: deque[float] = deque(maxlen=26)
        ticks.append(time.perf_counter())
        loop_start = None
        while True:
            if self._sigint:  # Ctrl-C, raised here between two steps (see run)
                raise KeyboardInterrupt
            t0, c0 = time.perf_counter(), time.process_time()
            if loop_start is None:
                loop_start = t0
            speed = self._speed_of(info)
            t_action = teacher.label(env) if teacher is not None else None  # the state the policy acts on
            d = driver.act(obs, None if self.env_worker else env, info)
            replay_frame = info.get("replay_frame")
            if self.replay_score is not None and replay_frame is not None:
                self.replay_score.observe(replay_frame, float(np.asarray(d.action).reshape(-1)[0]))
            t_class = None
            if teacher is not None:
                t_class = teacher.action_class(t_action)
                teacher.count(t_class, d.action_class)
            if self.env_worker:  # the worker steps while Grad-CAM and the drawing of frame t run below
                env.step_async(d.action)
                latency = time.perf_counter() - t0
            extras: dict = {}
            status = ov.explain(obs, d, extras)
            if not self.env_worker:
                latency = time.perf_counter() - t0
            if renderer is not None:
                fps = (len(ticks) - 1) / (ticks[-1] - ticks[0]) if len(ticks) > 1 and ticks[-1] > ticks[0] else 0.0
                view = StepView(frame=obs, step=steps + 1, action=d.action if np.isscalar(d.action) else None,
                                probs=d.probs, speed=speed, episode_return=ep_return, fps=fps, seed=seed,
                                episode=episode, episodes=self.cfg.episodes, policy_state=d.state, extras=extras,
                                latency_ms=1000 * latency, status=status,
                                steering=None if np.isscalar(d.action) else float(np.asarray(d.action).reshape(-1)[0]),
                                throttle=info.get("throttle_command", info.get("throttle", _throttle_of(d.action))),
                                standstill_steps=self.stalls.standstill_run,
                                longest_standstill=self.stalls.longest_standstill,
                                off_road_steps=self.stalls.off_road_steps, teacher_class=t_class,
                                driver_steering=info.get("driver_steering"),
                                notes=self.replay_score.hud_lines(replay_frame) if self.replay_score is not None
                                else ())
                canvas = renderer.compose(view)
                if self.writer is not None:
                    self.writer.append(renderer.to_rgb())
                if window is not None:
                    window.present(canvas)
                    window.poll()
                    if self.paused:
                        self._wait_while_paused(view)
            if self.env_worker:
                obs, reward, terminated, truncated, info = env.step_wait()
                speed_after, off_road = float(info["speed"]), bool(info["off_road"])
                missed = info.get("tiles_missed")
            else:
                obs, reward, terminated, truncated, info = env.step(d.action)
                speed_after, off_road, missed = car_speed(env), all_wheels_off_road(env), tiles_missed(env)
            steps += 1
            self.stalls.update(speed_after, off_road, missed)
            ov.record(extras, d, float(reward), episode, steps, float(info.get("time_s", steps / self.env_fps)),
                      speed=speed_after, off_road=off_road,
                      teacher=None if teacher is None else (action_number(t_action), t_class))
            ep_return += float(reward)
            now = time.perf_counter()
            ticks.append(now)
            self.step_seconds.append(now - t0)
            self.step_cpu_seconds.append(time.process_time() - c0)
            self.latency_seconds.append(latency)
            self.episode_fps = steps / max(now - loop_start, 1e-9)
            if terminated or truncated:
                return "done", ep_return, steps
            if self._quit:
                return "quit", ep_return, steps
            if self.restart_requested:
                self.restart_requested = False
                return "restart", ep_return, steps

    def _wait_while_paused(self, view: StepView) -> None:
        window, renderer = self.window, self.renderer
        view.paused = True
        canvas = renderer.compose(view)
        while self.paused and not (self.single_step or self._quit or self.restart_requested):
            window.present(canvas)
            window.poll()
            if self._sigint:
                raise KeyboardInterrupt
            time.sleep(1 / 30)
        self.single_step = False
        if window.pacer is not None:
            window.pacer.reset()  # no rush to make up the paused time

    def run(self) -> int:
        """All episodes; prints each one's return and stall figures (:func:`stall_text`) and the mean
        return. Returns the exit code."""
        quiet_gc()
        # Ctrl-C sets a flag that the step loop turns into KeyboardInterrupt between two steps: the default
        # handler raises it wherever Python is, and one raised inside a weakref callback or __del__ is only
        # printed ("Exception ignored in ..."), so the drive went on to the episode's end and exited 0
        self._sigint = False
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            return self._run_episodes()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum, frame) -> None:
        if self._sigint:  # a second Ctrl-C: stop now, as the default handler would
            raise KeyboardInterrupt
        self._sigint = True

    def _run_episodes(self) -> int:
        """The episodes of :meth:`run`; the exit code."""
        cfg = self.cfg
        returns: list[float] = []
        ep, code = 0, EXIT_OK
        ep_return, steps = 0.0, 0
        try:
            if self.replay is not None and self.replay_sim is None:
                self._start_replay()
            while ep < cfg.episodes:
                seed = cfg.track_seed + ep
                how, ep_return, steps = self.play_episode(seed, ep + 1)
                note = {"quit": "  (stopped)", "restart": "  (restarted)"}.get(how, "")
                cut = how != "done" or bool(cfg.max_steps and cfg.max_steps < EPISODE_STEPS and steps >= cfg.max_steps
                                            and self.stalls.tiles_missed)
                print(f"episode {ep + 1}/{cfg.episodes}  seed {seed}  return {ep_return:8.1f}  steps {steps:4d}  "
                      f"mean FPS {self.episode_fps:6.1f}{note}{stall_text(self.stalls, cut_short=cut)}"
                      f"{self.teacher.text() if self.teacher is not None else ''}", flush=True)
                if how == "quit":
                    break
                if how == "restart":
                    continue
                returns.append(ep_return)
                ep += 1
        except KeyboardInterrupt:
            print(f"\ninterrupted: episode {ep + 1} stopped after {steps} steps{stall_text(self.stalls, cut_short=True)}",
                  flush=True)
            code = EXIT_INTERRUPTED
        if returns:
            print(f"mean return over {len(returns)} episode{'s' if len(returns) != 1 else ''}: "
                  f"{float(np.mean(returns)):.1f} (std {float(np.std(returns)):.1f})", flush=True)
        else:
            print("no episode finished", flush=True)
        if self.replay_sim is not None:
            for line in self.replay_summary():
                print(line, flush=True)
        return code

    # ------------------------------------------------------------------ replay
    def _start_replay(self) -> None:
        """Connect the simulator that plays ``--replay``'s recording to the bridge (its own threads send the
        frames, one per reply, and close the connection after the last; :mod:`envs.udacity.replay`)."""
        from envs.udacity.replay import ReplaySimulator

        rec, bridge = self.replay, self.env.unwrapped
        self.replay_sim = ReplaySimulator(bridge.port, rec.images, rec.steering, rec.throttle, rec.speed,
                                          host=bridge.host)
        self.replay_sim.connect()

    def replay_summary(self) -> list[str]:
        """The closing lines of ``--replay`` (:func:`agent.drive.replay.summary_lines`): the frames sent and
        answered, the answers' rate (from the first frame sent to the last answer), and
        :func:`agent.eval.steering.intent_scores` of the steering the simulator received against the
        recording's labels."""
        sim = self.replay_sim
        answered = sim.answered
        span = (sim.t_last_answer or 0.0) - (sim.t_first_sent or 0.0)
        fps = answered / span if answered and span > 0 else float("nan")
        return summary_lines(self.replay, sim.frames_sent, answered, sim.resent, fps,
                             final_scores(sim.answers, self.replay))

    def _close_traces(self) -> None:
        """Write the rest of ``--dump-traces`` and close its file (nothing to do without it)."""
        writer = self.trace_writer
        if writer is None:
            return
        steps = len(writer)
        out = writer.close()  # also after Ctrl-C: the buffered steps are written and the file marked complete
        nac = self.overlays.nac_dump
        why = "" if nac else (getattr(self.driver, "traces_reason", None) or "the policy has no NAC core")
        if out is not None and nac:
            print(f"wrote {out} (NAC traces of {steps} steps)")
        elif out is not None:
            print(f"wrote {out} ({steps} steps: actions, rewards, speeds and labels; no NAC traces: {why})")
        else:
            print("drive: note: nothing to dump (no step ran)", file=sys.stderr)

    def close(self) -> None:
        """Finalise the video and the trace dump (each also when the other fails, and after Ctrl-C),
        release Grad-CAM's hooks, close the window and env."""
        import torch

        try:
            try:
                if self.replay_sim is not None:
                    self.replay_sim.close()
                if self.writer is not None:
                    before = os.times()
                    self.writer.close()  # finalises the mp4, also after Ctrl-C; waits for ffmpeg
                    self.encoder_cpu_seconds = _children_cpu(before)
                    print(f"wrote {self.writer.path} ({self.writer.frames} frames, "
                          f"{self.writer.frames / self.env_fps:.1f} s at {self.env_fps} FPS)")
            finally:
                self._close_traces()
        finally:
            gc.unfreeze()
            self.overlays.close()
            if self.window is not None:
                self.window.close()
            before = os.times()
            self.env.close()  # waits for the env worker, if any
            if self.env_worker:
                self.env_worker_cpu_seconds = _children_cpu(before)
            torch.set_num_threads(self._threads)


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "TIMING_STEPS", "DriveSession", "quiet_gc", "run_drive", "stall_text"]
