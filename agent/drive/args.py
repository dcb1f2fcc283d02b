"""The ``drive`` command line: its options (:func:`add_drive_arguments`), their checks
(:func:`check_drive_args`) and the run's constants.

Nothing heavy is imported here (no pygame, torch or gymnasium), so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from envs.tracks import EVAL_SEED_BASE

#: The first track never used for training (``envs.tracks`` imports nothing heavy).
DEFAULT_SEED = EVAL_SEED_BASE
#: CarRacing's simulation rate (``envs.carracing.FPS``); also the rate of recorded videos.
ENV_FPS = 50
ENVS = ("carracing", "udacity")
#: Frame upscale per simulator: CarRacing's 96x96 and Udacity's 320x160 camera.
DEFAULT_SCALE = {"carracing": 6, "udacity": 2}


def add_drive_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``drive`` options to ``parser`` (run them with :func:`agent.drive.session.run_drive`)."""
    parser.add_argument("--env", default="carracing", choices=list(ENVS),
                        help="simulator: carracing (gymnasium, built in) or udacity (the Udacity self-driving-car "
                             "simulator, started by you in Autonomous mode; it connects to --host:--port) "
                             "(default: %(default)s)")
    parser.add_argument("--policy", default="nac.pt",
                        help="policy file: a NAC policy (.pt) or the PPO expert (.zip); a name that is not an "
                             "existing path is looked up in the repository's policies/ folder (default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=1, help="episodes to drive (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="track seed of the first episode; episode i drives track seed+i. The default "
                             "%(default)s is the first track never used for training")
    parser.add_argument("--max-steps", type=int, default=None, metavar="M",
                        help="step limit per episode (default: the env's own, 1000 steps = 20 s at 50 FPS)")
    parser.add_argument("--headless", action="store_true",
                        help="no window (also chosen automatically when no display is available); "
                             "runs as fast as possible")
    parser.add_argument("--record", default=None, metavar="PATH",
                        help="write the composed view (frame + HUD) to this .mp4 (H.264, 50 FPS)")
    parser.add_argument("--scale", type=int, default=None,
                        help="upscale factor of the frame, nearest neighbour (default: 6 for CarRacing's 96x96, "
                             "2 for Udacity's 320x160)")
    parser.add_argument("--fps-limit", type=float, default=float(ENV_FPS),
                        help="frame-rate cap of the window, 50 = CarRacing's own rate; 0 = as fast as possible. "
                             "Headless runs are never limited (default: %(default)g)")
    parser.add_argument("--env-worker", choices=("auto", "on", "off"), default="auto",
                        help="step CarRacing in a worker process, so that drawing frame t overlaps the env's "
                             "step to t+1 (the env's own rendering is about half of a step's CPU). auto: when "
                             "frames are drawn (window or --record) on a machine with 2+ CPUs and the policy is "
                             "not the expert. Same episodes either way; when the machine's other core is busy, off is "
                             "faster (default: %(default)s)")
    ud = parser.add_argument_group("udacity", "the bridge the Udacity simulator connects to (socket.io)")
    ud.add_argument("--host", default="127.0.0.1",
                    help="interface to listen on; the loopback default means nobody on the network can steer "
                         "the car (default: %(default)s)")
    ud.add_argument("--port", type=int, default=4567,
                    help="TCP port; the simulator always connects to 4567 (default: %(default)s)")
    ud.add_argument("--target-speed", type=float, default=15.0, metavar="MPH",
                    help="cruise speed of the throttle controller, mph (default: %(default)s)")
    ud.add_argument("--connect-timeout", type=float, default=300.0, metavar="S",
                    help="seconds to wait for the simulator to connect (default: %(default)s)")
    te = parser.add_argument_group("teacher", "CarRacing: label every step with what the PPO expert would do in the "
                                    "same state (the DAgger teacher's view of the run): the HUD shows its action "
                                    "beside the policy's, each episode's line prints how often they agree, and "
                                    "--dump-traces stores it (teacher_action, teacher_class). Find where a "
                                    "failure starts: the first steps where the two part before the car leaves "
                                    "the road")
    te.add_argument("--teacher", default=None, metavar="EXPERT",
                    help="the expert .zip that labels the steps, with its start rule (gas at a standstill, no "
                         "brake below 10 units/s), as DAgger uses it; a bare name is looked up in policies/, e.g. "
                         "carracing-expert-discrete-margin.zip (the teacher of nac.pt). The env then runs in this "
                         "process (the expert reads its state)")
    te.add_argument("--teacher-creep-speed", type=float, default=0.0, metavar="V",
                    help="the teacher's creep rule: below V units/s its label is gas (discrete experts; nac.pt's "
                         "DAgger rounds used 10). 0: off, the expert's own action (default: %(default)s)")
    te.add_argument("--teacher-grass-rule", action="store_true",
                    help="the teacher's grass rule: with all four wheels on the grass its brake becomes gas, as "
                         "`agent train --grass-rule` teaches it (discrete experts)")
    te.add_argument("--teacher-brake-floor", type=float, default=None, metavar="V",
                    help="the teacher's start rule turns brake into gas below V units/s instead of 10, as `agent "
                         "train --brake-floor` teaches it (README, 'The brake floor')")
    ov = parser.add_argument_group("overlays", "live interpretability: Grad-CAM saliency over the frame and the "
                                    "NAC neuron traces (phi, omega, logits, weights, NCP neuron groups) in the "
                                    "right panel. Keys in the window: P/space pause, N/. single step, S saliency, "
                                    "T traces, H next head, [ and ] heat-map opacity, R restart the episode, "
                                    "Q/Esc quit")
    ov.add_argument("--no-overlay", action="store_true", help="no saliency, no traces, no panel (plain view)")
    ov.add_argument("--no-saliency", action="store_true",
                    help="start with the Grad-CAM overlay off (not computed, so --dump-traces stores no cam)")
    ov.add_argument("--no-traces", action="store_true", help="start without the NAC trace panel")
    ov.add_argument("--cam-opacity", type=float, default=0.5, metavar="A",
                    help="peak opacity of the Grad-CAM heat map, 0..1 (default: %(default)s)")
    ov.add_argument("--dump-traces", default=None, metavar="PATH",
                    help="write every step's NAC traces (phi, omega, logits, weights, kept keys, neuron groups), "
                         "actions, rewards, its Grad-CAM map (cam, at the frame's resolution; computed also "
                         "headless, absent with --no-saliency or --no-overlay) and the stall figures (speed, "
                         "off_road per step; longest_standstill_steps, off_road_steps per episode) to this .npz; "
                         "plot the traces with `agent plot-traces`")


def check_drive_args(args) -> str | None:
    """The first problem with the ``drive`` options ``args`` as a message, or None if they are usable."""
    if args.env not in ENVS:
        return f"--env {args.env!r} is not supported (choices: {', '.join(ENVS)})"
    if args.episodes < 1:
        return f"--episodes must be >= 1, got {args.episodes}"
    if args.max_steps is not None and args.max_steps < 1:
        return f"--max-steps must be >= 1, got {args.max_steps}"
    if args.scale is not None and args.scale < 1:
        return f"--scale must be >= 1, got {args.scale}"
    if args.env == "udacity" and not (0 <= args.port < 65536):
        return f"--port must be in 0..65535, got {args.port}"
    if args.env == "udacity" and (args.target_speed <= 0 or args.connect_timeout <= 0):
        return "--target-speed and --connect-timeout must be > 0"
    if args.fps_limit < 0:
        return f"--fps-limit must be >= 0, got {args.fps_limit}"
    if args.record is not None and Path(args.record).suffix.lower() != ".mp4":
        return f"--record writes an mp4 video; give a path ending in .mp4, got {args.record!r}"
    if not 0.0 <= args.cam_opacity <= 1.0:
        return f"--cam-opacity must be in 0..1, got {args.cam_opacity}"
    teacher = getattr(args, "teacher", None)
    creep = getattr(args, "teacher_creep_speed", 0.0)
    if teacher is not None and args.env != "carracing":
        return "--teacher labels CarRacing steps with the PPO expert; the Udacity simulator has no expert"
    if teacher is not None and Path(teacher).suffix.lower() != ".zip":
        return f"--teacher takes the PPO expert's .zip (e.g. carracing-expert-discrete-margin.zip), got {teacher!r}"
    if not creep >= 0:
        return f"--teacher-creep-speed must be a speed >= 0 units/s (0: off), got {creep}"
    if creep and teacher is None:
        return "--teacher-creep-speed sets the teacher's creep rule; give the teacher with --teacher EXPERT.zip"
    floor = getattr(args, "teacher_brake_floor", None)
    if floor is not None and not (floor >= 0 and math.isfinite(floor)):
        return f"--teacher-brake-floor must be a speed >= 0 units/s, got {floor}"
    if floor is not None and teacher is None:
        return "--teacher-brake-floor sets the teacher's start rule; give the teacher with --teacher EXPERT.zip"
    if getattr(args, "teacher_grass_rule", False) and teacher is None:
        return "--teacher-grass-rule sets the teacher's grass rule; give the teacher with --teacher EXPERT.zip"
    if teacher is not None and getattr(args, "env_worker", "auto") == "on":
        return "--teacher reads the env's state in this process; use --env-worker auto or off with it"
    if args.dump_traces is not None and Path(args.dump_traces).suffix.lower() != ".npz":
        return f"--dump-traces writes a .npz file; give a path ending in .npz, got {args.dump_traces!r}"
    return None


__all__ = ["DEFAULT_SCALE", "DEFAULT_SEED", "ENVS", "ENV_FPS", "add_drive_arguments", "check_drive_args"]
