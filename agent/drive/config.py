"""The ``drive`` command's options: one frozen dataclass, :class:`DriveConfig`, parsed by tyro
(:func:`parse_drive_args`), and the run's constants.

Sections: ``udacity`` (:class:`UdacityOptions`, the bridge the Udacity simulator connects to) and
``teacher`` (:class:`agent.train.config.TeacherSection`, the PPO expert that labels every step; the
same names as in every command that drives a teacher). Every value is checked once: each field in
``__post_init__`` (tyro reports a bad one and exits with code 2), the rules between fields and
the files the run would replace in :meth:`DriveConfig.check`; both raise
:class:`agent.train.config.ConfigError` with one line that names the option.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agent.train.config import ConfigError, TeacherSection, check_device
from envs.tracks import EVAL_SEED_BASE

#: The first track never used for training (``envs.tracks`` imports nothing heavy).
DEFAULT_SEED = EVAL_SEED_BASE
#: CarRacing's simulation rate (``envs.carracing.FPS``); also the rate of recorded videos.
ENV_FPS = 50
ENVS = ("carracing", "udacity")
#: The file names ``--dump-traces`` writes (:class:`agent.drive.traces.TraceWriter`): HDF5, streamed, or
#: ``.npz``, streamed to HDF5 and converted at the end.
TRACE_SUFFIXES = (".h5", ".hdf5", ".npz")
#: Frame upscale per simulator: CarRacing's 96x96 and Udacity's 320x160 camera.
DEFAULT_SCALE = {"carracing": 6, "udacity": 2}
#: drive's teacher: the start rule ON, as DAgger's teacher labels (``agent train`` with
#: ``--teacher.start-rule``): without it a discrete expert brakes a slow car to a halt and its labels
#: at a standstill say "stay" (README, "The expert's stalls"), which is not what a student is
#: taught. ``--teacher.no-start-rule`` shows the expert's network alone.
DRIVE_TEACHER = TeacherSection(start_rule=True)

#: ``--saliency-method`` choices: the keys of :data:`agent.drive.saliency.SALIENCY_METHODS` (kept here
#: as a Literal so that ``--help`` does not import torch; a test holds the two equal).
SaliencyMethod = Literal["hirescam", "layercam", "gradcam", "gradcam++", "xgradcam", "gradcam-elementwise"]

DESCRIPTION = """Run a policy in the simulator with a live window (frame, action, speed, return, FPS).

Without a display, or with --headless, it runs without a window; --record writes an mp4.
Live interpretability: a saliency heat map over the frame (HiResCAM at the CNN's first convolution
by default: the most faithful live method measured) and the NAC neuron traces (phi, omega,
logits, weights, NCP neuron groups) in the right panel. Keys in the window: P/space pause, N/.
single step, S saliency, T traces, H next head, [ and ] heat-map opacity, R restart the episode,
Q/Esc quit. With --env udacity, --replay DIR plays a recorded drive through the bridge and scores
the policy's steering against the driver's."""

TEACHER_HELP = ("CarRacing: label every step with what the PPO expert would do in the same state (the DAgger "
                "teacher's view of the run): the HUD shows its action beside the policy's, each episode's line prints "
                "how often they agree, and --dump-traces stores it (teacher_action, teacher_class). Find where a "
                "failure starts: the first steps where the two part before the car leaves the road. The start rule "
                "is on by default here (gas at a standstill, no brake below the brake floor, 10 units/s), as DAgger "
                "uses the teacher; --teacher.no-start-rule shows the expert's network alone. The env then runs in "
                "this process (the expert reads its state)")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class UdacityOptions:
    """The bridge the Udacity simulator connects to (socket.io); --env udacity only."""

    host: str = "127.0.0.1"
    """interface to listen on; the loopback default means nobody on the network can steer the car"""
    port: int = 4567
    """TCP port; the simulator always connects to 4567 (0: any free port)"""
    target_speed: float = 15.0
    """cruise speed of the throttle controller, mph"""
    connect_timeout: float = 300.0
    """seconds to wait for the simulator to connect"""

    def __post_init__(self):
        _need(0 <= self.port < 65536, f"--udacity.port must be in 0..65535, got {self.port}")
        _need(self.target_speed > 0 and self.connect_timeout > 0,
              f"--udacity.target-speed and --udacity.connect-timeout must be > 0, got {self.target_speed} and "
              f"{self.connect_timeout}")


@dataclass(frozen=True)
class DriveConfig:
    """Watch a policy drive: the options of ``drive`` (also ``agent drive``).

    Raises:
        ConfigError: a value out of range (when built), or from :meth:`check`, options that do not
            go together or a file that exists; one line naming the option.
    """

    env: Literal["carracing", "udacity"] = "carracing"
    """simulator: carracing (gymnasium) or udacity (the Udacity simulator in Autonomous mode, started by you)"""
    policy: str = "nac.pt"
    """policy file: a NAC policy (.pt) or the PPO expert (.zip); a name that is not a path is looked up in policies/"""
    episodes: int = 1
    """episodes to drive"""
    track_seed: int = DEFAULT_SEED
    """the first track (CarRacing seed): episode i drives track_seed+i; the default is the first evaluation track"""
    max_steps: int | None = None
    """step limit per episode; None: the env's own, 1000 steps = 20 s at 50 FPS"""
    headless: bool = False
    """no window (also chosen automatically when no display is available); runs as fast as possible"""
    record: str | None = None
    """write the composed view (frame + HUD) to this .mp4 (H.264, 50 FPS)"""
    dump_traces: str | None = None
    """write each step's actions, rewards, stall figures, teacher labels (with --teacher.expert), Grad-CAM map (cam; not
    with --no-saliency) and, for a NAC core, its NAC traces (phi, omega, logits, attention, neurons) to
    this .h5 (HDF5, streamed in chunks of 256 steps: memory stays flat and the file reads back after an interrupt) or
    .npz (streamed to FILE.npz.partial.h5, converted at the end); plot them with `agent plot-traces`"""
    overwrite: bool = False
    """replace an existing --record or --dump-traces file"""
    scale: int | None = None
    """upscale of the frame, nearest neighbour; None: 6 for CarRacing's 96x96, 2 for Udacity's 320x160"""
    fps_limit: float = float(ENV_FPS)
    """frame-rate cap of the window (50: CarRacing's own rate; 0: none); headless runs are never limited"""
    env_worker: Literal["auto", "on", "off"] = "auto"
    """step CarRacing in a worker process while frame t is drawn; auto: when frames are drawn on 2+ CPUs and the
    policy is not the expert (the same episodes; off is faster when the other core is busy)"""
    device: str = "auto"
    """torch device of the policy: auto (cuda when there is one), cpu, cuda, cuda:N"""
    overlay: bool = True
    """the saliency, the traces and their panel (--no-overlay: the plain view)"""
    saliency: bool = True
    """start with the saliency overlay on (--no-saliency: not computed, so --dump-traces stores no cam)"""
    saliency_method: SaliencyMethod = "hirescam"
    """the CAM method of pytorch-grad-cam drawn live: hirescam (the default; the most faithful of those that pass the
    sanity check, by ROAD on unseen tracks), layercam, gradcam (the paper's; often empty or on the grass at the last
    convolution), gradcam++, xgradcam, gradcam-elementwise"""
    saliency_layer: str = "auto"
    """the convolution the map is computed at: conv1 .. convN, last, or auto (the first: the most faithful for
    HiResCAM on CarRacing)"""
    traces: bool = True
    """start with the NAC trace panel on"""
    cam_opacity: float = 0.5
    """peak opacity of the Grad-CAM heat map, 0..1"""
    replay: str | None = None
    """--env udacity: play this recorded drive (a folder of the simulator's training mode: driving_log.csv beside
    IMG/) as the simulator, over the bridge's wire protocol on a free loopback port (--udacity.host and
    --udacity.port are not used): its center-camera frames in capture-time order, each with its capture time as the
    policy's time input, steered by the policy with the overlays on; the car does not follow the policy. The HUD adds
    the driver's steering and the running scores against the driver's intent; at the end of the recording (or on
    Escape / Ctrl-C) it prints the frames, the FPS and the scores of `agent evaluate --env udacity` (smoothed ratio,
    Pearson r, share of curve frames turned the right way, left / right, mean |steering| on curves against the
    driver's)"""
    udacity: UdacityOptions = UdacityOptions()
    teacher: Annotated[TeacherSection, tyro.conf.arg(help=TEACHER_HELP)] = DRIVE_TEACHER

    def __post_init__(self):
        check_device(self.device)
        _need(self.env in ENVS, f"--env {self.env!r} is not supported (choices: {', '.join(ENVS)})")
        _need(self.episodes >= 1, f"--episodes must be >= 1, got {self.episodes}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}")
        _need(self.scale is None or self.scale >= 1, f"--scale must be >= 1, got {self.scale}")
        _need(self.fps_limit >= 0, f"--fps-limit must be >= 0, got {self.fps_limit}")
        _need(self.record is None or Path(self.record).suffix.lower() == ".mp4",
              f"--record writes an mp4 video; give a path ending in .mp4, got {self.record!r}")
        _need(0.0 <= self.cam_opacity <= 1.0, f"--cam-opacity must be in 0..1, got {self.cam_opacity}")
        _need(self.saliency_layer in ("auto", "last") or (self.saliency_layer.startswith("conv")
                                                          and self.saliency_layer[4:].isdigit()
                                                          and int(self.saliency_layer[4:]) >= 1),
              f"--saliency-layer takes conv1, conv2, ... (the CNN's convolutions in order), last or auto, "
              f"got {self.saliency_layer!r}")
        _need(self.dump_traces is None or Path(self.dump_traces).suffix.lower() in TRACE_SUFFIXES,
              f"--dump-traces writes an HDF5 (.h5, .hdf5) or .npz file; give a path ending in one of them, "
              f"got {self.dump_traces!r}")

    def check(self) -> "DriveConfig":
        """The rules between options, and the files the run would replace; returns self.

        Raises:
            ConfigError: a teacher for the Udacity simulator or that is not an expert .zip, teacher
                rules without a teacher, a brake floor without the start rule, a teacher with
                ``--env-worker on``, or an existing ``--record`` / ``--dump-traces`` file without
                ``--overwrite``; ``--replay`` without ``--env udacity`` or with ``--episodes``.
        """
        t = self.teacher
        if t.expert is None:
            rules = [f"--teacher.{'no-' if getattr(t, f.name) is False else ''}{f.name.replace('_', '-')}"
                     for f in fields(t) if getattr(t, f.name) != getattr(DRIVE_TEACHER, f.name)]
            _need(not rules, f"{', '.join(rules)} set{'s' if len(rules) == 1 else ''} the teacher's rules; give the "
                             "teacher with --teacher.expert EXPERT.zip")
        else:
            _need(self.env == "carracing", "--teacher.expert labels CarRacing steps with the PPO expert; the Udacity "
                                           "simulator has no expert")
            _need(Path(t.expert).suffix.lower() == ".zip", "--teacher.expert takes the PPO expert's .zip (e.g. "
                                                           f"carracing-expert-discrete-margin.zip), got {t.expert!r}")
            _need(t.brake_floor is None or t.start_rule, "--teacher.brake-floor is the start rule's floor: drop "
                                                         "--teacher.no-start-rule or the floor")
            _need(self.env_worker != "on", "--teacher.expert reads the env's state in this process; use --env-worker "
                                           "auto or off with it")
        if self.replay is not None:
            _need(self.env == "udacity", "--replay plays a Udacity simulator recording; add --env udacity")
            _need(self.episodes == 1, "--replay plays the recording once; drop --episodes")
        partial = None if self.dump_traces is None else self.dump_traces + ".partial.h5"  # a .npz dump's stream
        for option, path in (("--record", self.record), ("--dump-traces", self.dump_traces), ("--dump-traces", partial)):
            _need(path is None or self.overwrite or not Path(path).exists(),
                  f"{option} {path} already exists; choose another path or pass --overwrite")
        return self

    @property
    def frame_scale(self) -> int:
        """The frame's upscale factor: ``scale``, or the simulator's default (:data:`DEFAULT_SCALE`)."""
        return self.scale or DEFAULT_SCALE[self.env]


def parse_drive_args(argv: list[str], prog: str = "drive") -> DriveConfig:
    """The checked :class:`DriveConfig` of ``drive ARGV``.

    ``--help`` prints the options and exits (code 0); a value out of range is reported by tyro
    (exit code 2).

    Raises:
        ConfigError: from :meth:`DriveConfig.check`.
    """
    return tyro.cli(DriveConfig, args=list(argv), prog=prog, description=DESCRIPTION).check()


__all__ = ["DEFAULT_SCALE", "DEFAULT_SEED", "DESCRIPTION", "DRIVE_TEACHER", "DriveConfig", "ENVS", "ENV_FPS",
           "SaliencyMethod", "TRACE_SUFFIXES", "UdacityOptions", "parse_drive_args"]
